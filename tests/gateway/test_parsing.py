"""Hostile and malformed bodies thrown at the gateway's request parsing: a Refusal with a status, never
another exception."""
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from panel.gateway.app import bearer, parse_request
from panel.gateway.pipeline import Refusal

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                        max_size=4), max_leaves=20)
FIELDS = st.fixed_dictionaries({}, optional={
    "model": JSON, "messages": JSON, "prompt": JSON, "stream": JSON, "max_tokens": JSON,
    "stream_options": JSON, "response_format": JSON})


def outcome(raw, endpoint):
    try:
        body = parse_request(raw, endpoint)
    except Refusal as error:
        assert 400 <= error.status < 500 and str(error)
        return None
    assert isinstance(body, dict) and isinstance(body["model"], str)
    return body


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(["chat", "completions"]))
def test_it_never_crashes_on_arbitrary_bytes(raw, endpoint):
    outcome(raw, endpoint)


@settings(max_examples=300, deadline=None)
@given(FIELDS, st.sampled_from(["chat", "completions"]))
def test_it_never_crashes_on_hostile_json(fields, endpoint):
    body = outcome(json.dumps(fields, allow_nan=True).encode(), endpoint)
    if body is not None:
        assert body["model"].strip()
        if endpoint == "chat":
            assert body["messages"] and all(isinstance(m, dict) for m in body["messages"])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=80))
def test_it_never_crashes_on_arbitrary_authorization_headers(value):
    try:
        bearer({"headers": [(b"authorization", value)]})
    except Refusal as error:
        assert error.status == 401


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=20_000, max_value=200_000),
       st.sampled_from(["[", '{"a":', '{"model": "m", "messages": [']))
def test_it_refuses_hostile_nesting_with_a_400(depth, opener):
    try:
        parse_request((opener * depth).encode(), "chat")
    except Refusal as error:
        assert (error.status, str(error)) == (400, "the body is nested too deeply")
    else:
        raise AssertionError("a body nested past the parser's stack was accepted")


def test_it_counts_an_answer_nested_past_the_parser_as_not_json():
    from panel.gateway.responses import is_json

    assert is_json("[" * 100_000 + "]" * 100_000) is False and is_json('{"ok": [1, 2]}') is True
