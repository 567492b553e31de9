"""Hostile uploads thrown at the two file importers that are not config files: calibration text (quantization jobs)
and benchmark prompt files. Whatever the bytes, each answers with its result or a ValidationError in words, never
another exception (which would be a 500)."""
import json

from django.core.exceptions import ValidationError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from panel.benchmarks.workload import parse_prompt_file
from panel.registry.services import MIN_CALIBRATION_CHARACTERS, calibration_text_check

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4), max_leaves=12)


@FUZZ
@given(data=st.binary(max_size=4096))
def test_it_answers_any_bytes_as_calibration_text_or_says_why_not(data):
    try:
        text = calibration_text_check(data)
    except ValidationError as error:
        assert error.messages and all(message.startswith("The calibration file") for message in error.messages)
    else:
        assert len(text.strip()) >= MIN_CALIBRATION_CHARACTERS and "\x00" not in text


@FUZZ
@given(data=st.binary(max_size=2048), name=st.sampled_from(["prompts.txt", "prompts.jsonl", "p.JSON", "x"]))
def test_it_parses_any_bytes_as_a_prompt_file_or_says_why_not(data, name):
    try:
        prompts = parse_prompt_file(data, name=name, max_bytes=1024)
    except ValidationError as error:
        assert error.messages and error.messages[0]
    else:
        assert prompts and all(messages and all(m["role"] in ("system", "user", "assistant")
                                                and isinstance(m["content"], str) for m in messages)
                               for messages in prompts)


@FUZZ
@given(lines=st.lists(json_values, min_size=1, max_size=6))
def test_it_takes_only_prompt_objects_from_jsonl(lines):
    data = "\n".join(json.dumps(value) for value in lines).encode()
    try:
        prompts = parse_prompt_file(data, name="p.jsonl", max_bytes=1 << 20)
    except ValidationError as error:
        assert error.messages[0].startswith("line ") or error.messages[0].startswith("The file")
    else:
        assert len(prompts) == len([line for line in data.decode().splitlines() if line.strip()])


def test_it_refuses_hostile_nesting_in_words():
    try:
        parse_prompt_file(b"[" * 50_000, name="deep.jsonl", max_bytes=1 << 20)
    except ValidationError as error:
        assert error.messages == ["line 1 is nested too deeply to be a prompt."]
    else:
        raise AssertionError("a 50,000-deep line was accepted")
