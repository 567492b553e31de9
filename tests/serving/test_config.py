"""Serving profiles in and out of files: the seeds' config.toml, the launch command, vllm_deploy.sh and vLLM's
--config YAML. The engine test runs this vLLM's own argument parser on what we produce."""
import json
import math
import os
import shlex
import subprocess
import sys

import pytest
import yaml
from django.conf import settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from panel.serving.configfile import (
    FIELD_FLAGS,
    SERVER_MODULE,
    ConfigFileError,
    deploy_script,
    launch_argv,
    toml_export,
    toml_import,
    validate_extra_args,
    yaml_export,
)
from panel.serving.profile_fields import SECTIONS, TOML_FIELDS, defaults, section_fields
from tests.support.environment import FIXTURES

SEED_FILE = FIXTURES / "seed_config.toml"
SEED_VALUES = {
    "model_name": "Qwen/Qwen2.5-14B-Instruct", "dtype": "float16", "quantization": "awq", "quantization_bits": 4,
    "max_model_len": 8192, "enable_prefix_caching": True, "block_size": 16, "gpu_memory_utilization": 0.90,
    "swap_space": 4, "max_num_seqs": 256, "max_num_batched_tokens": 8192, "enable_chunked_prefill": True,
    "tensor_parallel_size": 2, "pipeline_parallel_size": 1,
}
# Seeds §4.1, flag by flag (its launch command, with the article's line breaks restored).
SEED_COMMAND = ("python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen2.5-14B-Instruct --quantization awq "
                "--gpu-memory-utilization 0.90 --max-num-seqs 256 --enable-prefix-caching --tensor-parallel-size 2 "
                "--port 8000")
SEED_ARGS = dict(model_path="Qwen/Qwen2.5-14B-Instruct", port=8000)


def seed_text():
    return SEED_FILE.read_text(encoding="utf-8")


def seed_profile(**changes):
    return {**defaults(), **toml_import(seed_text()), **changes}


def import_problems(text):
    with pytest.raises(ConfigFileError) as caught:
        toml_import(text)
    assert caught.value.problems and str(caught.value) == "\n".join(caught.value.problems)
    return caught.value.problems


# ------------------------------------------------------------------------------------------------- config.toml

def test_it_round_trips_the_seed_file_byte_for_byte():
    text = seed_text()
    assert "0.90  # 0.85-0.92 之间较稳" in text
    assert toml_export(toml_import(text)) == text
    assert toml_export(toml_import(SEED_FILE.read_bytes())).encode("utf-8") == SEED_FILE.read_bytes()


def test_it_reads_the_seeds_numbers():
    values = toml_import(seed_text())
    assert values == SEED_VALUES
    assert set(values) == {field.name for field in TOML_FIELDS}
    assert isinstance(values["gpu_memory_utilization"], float)


def test_it_writes_quantization_none_and_leaves_out_empty_bits():
    text = toml_export(seed_profile(quantization="none", quantization_bits=None))
    assert 'quantization = "none"  # 可选 awq / gptq / bitsandbytes' in text
    assert "quantization_bits" not in text
    values = toml_import(text)
    assert values["quantization"] == "none" and values["quantization_bits"] is None
    # A hand-written file that leaves quantization out means the same.
    assert toml_import('[model]\nname = "m"\n')["quantization"] == "none"


def test_it_fills_missing_keys_with_defaults():
    values = toml_import('[model]\nname = "/models/tiny"\n[batching]\nmax_num_seqs = 16\n')
    expected = {field.name: field.default for field in TOML_FIELDS}
    expected.update(model_name="/models/tiny", max_num_seqs=16)
    assert values == expected


@pytest.mark.parametrize("text, expected", [
    ("[model\nname = 1", "not valid TOML: "),
    ('[model]\nname = "a"\ndtype = float16\n', "(at line 3, column 9)"),
    ("", "[model].name is required"),
    ("# only a comment\n", "[model].name is required"),
    ('[model]\nname = "a"\n[kv_cache]\ngpu_memory_utilization = "high"\n',
     '[kv_cache].gpu_memory_utilization must be a number between 0 and 1, got "high"'),
    ('[model]\nname = "a"\n[kv_cache]\ngpu_memory_utilization = nan\n',
     "[kv_cache].gpu_memory_utilization must be a number between 0 and 1, got nan"),
    ('[model]\nname = "a"\n[kv_cache]\ngpu_memory_utilization = inf\n', "got inf"),
    ('[model]\nname = "a"\n[kv_cache]\ngpu_memory_utilization = 0\n', "gpu_memory_utilization must be a number"),
    ('[model]\nname = "a"\n[kv_cache]\ngpu_memory_utilization = true\n', "got true"),
    ('[model]\nname = "a"\nmax_model_len = 99999999999999999999999999999999999\n',
     "[model].max_model_len must be a whole number from 1 to 16,777,216, got a 35-digit number"),
    ('[model]\nname = "a"\nmax_model_len = ' + "9" * 5000 + "\n", "not valid TOML: a number has too many digits"),
    ('[model]\nname = "a"\nmax_model_len = 0x' + "f" * 5000 + "\n", "max_model_len must be a whole number from 1 to "
                                                                    "16,777,216, got a huge number"),
    ('[model]\nname = "a"\n[kv_cache]\ngpu_memory_utilization = 1e999\n', "gpu_memory_utilization must be a number"),
    ('[model]\nname = "a"\nmax_model_len = -5\n', "[model].max_model_len must be a whole number"),
    ('[model]\nname = "a"\nmax_model_len = 8192.0\n', "[model].max_model_len must be a whole number"),
    ('[model]\nname = "a"\nmax_model_len = 1979-05-27\n', "got the date/time 1979-05-27"),
    ('[model]\nname = "a"\nquantization = "AWQ"\n', '[model].quantization must be one of "none", "awq"'),
    ('[model]\nname = "a"\nquantization_bits = 3\n', "[model].quantization_bits must be one of 4, 8, got 3"),
    ('[model]\nname = "a"\nquantization_bits = 4.0\n', "[model].quantization_bits must be one of 4, 8"),
    ('[model]\nname = "a"\ndtype = ["float16"]\n', '[model].dtype must be a string, got an array'),
    ('[model]\nname = "a"\n[kv_cache]\nenable_prefix_caching = "yes"\n',
     '[kv_cache].enable_prefix_caching must be true or false, got "yes"'),
    ('[model]\nname = "a"\n[kv_cache]\nenable_prefix_caching = 1\n', "must be true or false, got 1"),
    ('[model]\nname = "a"\n[kv_cache]\nblock_size = 24\n', "[kv_cache].block_size must be one of 8, 16, 32"),
    ('[model]\nname = "a"\n[kv_cache]\nblock_size = true\n', "[kv_cache].block_size must be one of"),
    ('[model]\nname = "a"\n[parallel]\ntensor_parallel_size = 0\n', "[parallel].tensor_parallel_size must be"),
    ('[model]\nname = "a"\n[kv_cache]\nswap_space = -1\n', "[kv_cache].swap_space must be a whole number from 0"),
    ('[model]\nname = "a"\n[kv_cache]\nblok_size = 16\n',
     "unknown key [kv_cache].blok_size (did you mean block_size?)"),
    ('[model]\nname = "a"\nflavour = "x"\n', "unknown key [model].flavour; known keys: dtype, max_model_len"),
    ('[model]\nname = "a"\n[scheduler]\nx = 1\n', "unknown section [scheduler]"),
    ('name = "a"\n', "unknown key name at the top level"),
    ('[model]\nname = "a"\n[model.extra]\nx = 1\n', "unknown key [model].extra"),
    ('[model]\nname = { path = "a" }\n', "[model].name must be a string, got a table"),
    ('model = "x"\n', '[model] must be a table (a [model] section), got "x"'),
    ('[[model]]\nname = "a"\n', "[model] must be a table"),
    ('[model]\nname = ""\n', "[model].name must be a hub id or a path"),
    ('[model]\nname = "a\\u0000b"\n', "[model].name must be a hub id or a path"),
    ('[model]\nname = "a\ud800"\n', '[model].name must be a hub id or a path (1 to 1000 printable characters), '
                                      'got "a?"'),
    ('[model]\nname = "a"\nname = "b"\n', "not valid TOML: Cannot overwrite a value"),
    ("[model]\nname = " + "[" * 3000 + "]" * 3000 + "\n", "not valid TOML"),
    ("x" * 300_000, "characters; a config.toml is at most"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff", "not a text file: byte"),
    (b"[model]\nname = \"a\x00\"\n", "not valid TOML: Illegal character"),
    (None, "expected config.toml text, got NoneType"),
])
def test_it_refuses_bad_files_naming_the_path(text, expected):
    problems = import_problems(text)
    assert any(expected in problem for problem in problems), problems


def test_it_lists_every_problem_at_once():
    problems = import_problems('[model]\ndtype = "fp32"\n[kv_cache]\nblock_size = 12\n[extra]\n')
    assert len(problems) == 4
    joined = "\n".join(problems)
    for part in ("unknown section [extra]", "[model].name is required", "[model].dtype must be one of",
                 "[kv_cache].block_size must be one of"):
        assert part in joined


TOML_SCALARS = st.one_of(
    st.integers(), st.floats(), st.booleans(), st.text(max_size=12),
    st.sampled_from(["awq", "none", "float16", "bfloat16", "fp8", "auto"]), st.sampled_from([4, 8, 16, 0.9, 8192]),
    st.dates())


def toml_literal(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_literal(v)}"
                               for k, v in value.items()) + "}"
    return str(value) if isinstance(value, int) else value.isoformat()


def valid_value(field):
    if field.choices:
        options = st.sampled_from(field.choice_values)
        return options | st.none() if field.nullable else options
    if field.kind is bool:
        return st.booleans()
    if field.kind is float:
        return st.floats(min_value=0.01, max_value=1.0)
    if field.kind is int:
        return st.integers(min_value=int(field.min_value), max_value=int(field.max_value))
    return st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=40).filter(str.strip)


TOML_VALUES = st.recursive(TOML_SCALARS, lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=3), max_leaves=6)
KEYS = st.sampled_from([field.key for field in TOML_FIELDS]) | st.text(min_size=1, max_size=10)
TABLES = st.dictionaries(KEYS, TOML_VALUES, max_size=8)
VALID_PROFILES = st.fixed_dictionaries({field.name: valid_value(field) for field in TOML_FIELDS})


@st.composite
def near_valid_documents(draw):
    """A valid file, half the time with one key set to a random value: the fuzzing reaches the field checks."""
    values = draw(VALID_PROFILES)
    document = {section: {field.key: values[field.name] for field in section_fields(section)
                          if values[field.name] is not None} for section in SECTIONS}
    if draw(st.booleans()):
        document[draw(st.sampled_from(SECTIONS))][draw(KEYS)] = draw(TOML_VALUES)
    return document


DOCUMENTS = (st.dictionaries(st.sampled_from(SECTIONS) | st.text(min_size=1, max_size=8), TABLES, max_size=5) |
             near_valid_documents())


def render(document):
    lines = []
    for section, table in document.items():
        lines.append(f"[{json.dumps(section, ensure_ascii=False)}]")
        lines += [f"{json.dumps(key, ensure_ascii=False)} = {toml_literal(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


def assert_valid_profile(values):
    assert set(values) == {field.name for field in TOML_FIELDS}
    for field in TOML_FIELDS:
        value = values[field.name]
        if field.nullable and value is None:
            continue
        assert type(value) is field.kind, (field.name, value)
        if field.choices:
            assert value in field.choice_values
        elif field.kind is not bool and field.min_value is not None:
            assert field.min_value <= value <= field.max_value


FUZZ = hypothesis_settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text(st.characters(blacklist_categories=()), max_size=300) | st.binary(max_size=300))
def test_it_survives_random_text(text):
    try:
        assert_valid_profile(toml_import(text))
    except ConfigFileError as error:
        assert error.problems


@FUZZ
@given(DOCUMENTS)
def test_it_survives_random_toml_documents(document):
    try:
        assert_valid_profile(toml_import(render(document)))
    except ConfigFileError as error:
        assert error.problems and all(isinstance(problem, str) and problem for problem in error.problems)


@FUZZ
@given(VALID_PROFILES)
def test_it_reads_back_every_valid_profile_it_writes(values):
    assert toml_import(toml_export(values)) == values


# ------------------------------------------------------------------------------------------------- launching

def test_it_builds_the_seeds_launch_command():
    argv = launch_argv(seed_profile(), **SEED_ARGS)
    seed = shlex.split(SEED_COMMAND)
    assert argv[:3] == seed[:3] == ["python", "-m", SERVER_MODULE]
    # Every value in its flag's token (a value standing alone could be read by vLLM's parser as an option).
    pairs = dict(token.split("=", 1) for token in argv[3:] if "=" in token)
    for flag, value in zip(seed[3:], seed[4:] + [""]):
        if flag.startswith("--"):
            assert flag in argv or flag in pairs, flag
            if not value.startswith("--") and value:
                assert pairs[flag] == value or float(pairs[flag]) == float(value), flag
    assert argv == ["python", "-m", SERVER_MODULE, "--model=Qwen/Qwen2.5-14B-Instruct",
                    "--served-model-name=Qwen/Qwen2.5-14B-Instruct", "--dtype=float16",
                    "--quantization=awq", "--max-model-len=8192", "--block-size=16",
                    "--gpu-memory-utilization=0.9", "--max-num-seqs=256", "--max-num-batched-tokens=8192",
                    "--enable-chunked-prefill", "--enable-prefix-caching", "--tensor-parallel-size=2",
                    "--pipeline-parallel-size=1", "--enable-prompt-tokens-details", "--host=127.0.0.1",
                    "--port=8000"]


def test_it_leaves_quantization_to_a_quantized_checkpoint_and_says_no_when_off():
    argv = launch_argv(seed_profile(enable_prefix_caching=False, enable_chunked_prefill=False,
                                    served_model_name="qwen2.5-14b-instruct", extra_args="--enforce-eager"),
                       model_path="/data/qwen-awq", port=9001, engine_python="/venv/bin/python",
                       host="0.0.0.0", checkpoint_quantized=True)
    assert "--quantization" not in argv and "--swap-space" not in argv
    assert "--no-enable-prefix-caching" in argv and "--no-enable-chunked-prefill" in argv
    assert "--enable-prefix-caching" not in argv and "--enable-chunked-prefill" not in argv
    assert argv[0] == "/venv/bin/python" and argv[-2:] == ["--port=9001", "--enforce-eager"]
    assert "--served-model-name=qwen2.5-14b-instruct" in argv
    assert "--host=0.0.0.0" in argv
    assert "--quantization" not in launch_argv(seed_profile(quantization="none"), **SEED_ARGS)
    with_swap = launch_argv(seed_profile(), **SEED_ARGS, swap_space_flag=True)
    assert "--swap-space=4" in with_swap


@pytest.mark.parametrize("extra, expected", [
    ("--port 9000", "sets --port, which the profile already sets (port)"),
    ("--port=9000", "sets --port"),
    ("--max_model_len 4096", "sets --max_model_len, which the profile already sets (max_model_len)"),
    ("--max-model 4096", "(max_model_len)"),
    ("--model /other", "(model)"),
    ("--model.revision main", "(model)"),
    ("-tp 4", "(tensor_parallel_size)"),
    ("-q awq", "(quantization)"),
    ("--no-enable-prefix-caching", "(enable_prefix_caching)"),
    ("--config other.yaml", "(the profile itself)"),
    ("--swap-space 8", "(swap_space)"),
    ("--tool-call-parser hermes", "(tool_call_parser)"),
    ("--enable-auto-tool-choice", "(tool_call_parser)"),
    ("/models/other --enforce-eager", "must be a list of flags starting with --"),
    ("--enforce-eager -- /models/other", "may not contain a bare --"),
    ("--seed '1", "not a valid shell-quoted argument list: No closing quotation"),
    ("--chat-template 'a\x00b'", "control character"),
])
def test_it_refuses_extra_args_the_profile_owns_or_cannot_parse(extra, expected):
    with pytest.raises(ConfigFileError) as caught:
        launch_argv(seed_profile(extra_args=extra), **SEED_ARGS)
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


def test_tool_calling_is_a_profile_setting_that_starts_vllms_auto_tool_choice_with_its_parser():
    plain = launch_argv(seed_profile(), **SEED_ARGS)
    assert "--enable-auto-tool-choice" not in plain and not any("--tool-call-parser" in token for token in plain)
    argv = launch_argv(seed_profile(tool_call_parser="hermes"), **SEED_ARGS)
    assert "--enable-auto-tool-choice" in argv and "--tool-call-parser=hermes" in argv


def test_it_accepts_other_extra_args():
    assert validate_extra_args("--enforce-eager --seed -1 --max-log-len=100 --chat-template '{{ x }}'") == [
        "--enforce-eager", "--seed=-1", "--max-log-len=100", "--chat-template={{ x }}"]
    assert validate_extra_args("") == []


def test_it_writes_a_deploy_script_that_bash_runs_as_the_same_argv(tmp_path):
    injected = tmp_path / "injected"  # a newline in the name must not turn the rest into a command
    values = seed_profile(name=f"prod\ntouch {injected}", served_model_name="it's \"quoted\" $HOME",
                          extra_args=f"--enforce-eager --chat-template '{{{{ messages }}}} $(touch {injected})'")
    dump = tmp_path / "argdump"
    dump.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    dump.chmod(0o755)
    keywords = dict(model_path="/models/my model", port=8123, engine_python=str(dump))
    script = deploy_script(values, **keywords)
    path = tmp_path / "vllm_deploy.sh"
    path.write_text(script)
    assert script.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    argv = launch_argv(values, **keywords)
    for flag in [token.split("=", 1)[0] for token in argv if token.startswith("--")]:
        assert f"\n  {flag}" in script or f"\n  '{flag}" in script, flag
    assert "# swap_space = 4 is not passed" in script
    ran = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == argv[1:]
    assert not injected.exists()


def test_it_exports_yaml_that_maps_back_to_the_profile():
    values = seed_profile(enable_chunked_prefill=False, extra_args="--enforce-eager --max-log-len 100")
    loaded = yaml.safe_load(yaml_export(values, **SEED_ARGS))
    for name, flag in FIELD_FLAGS.items():
        if name == "swap_space":
            assert flag[2:] not in loaded
        elif name == "served_model_name":
            assert loaded[flag[2:]] == values["model_name"]
        else:
            assert loaded[flag[2:]] == values[name], name
    assert loaded["model"] == "Qwen/Qwen2.5-14B-Instruct" and loaded["port"] == 8000
    assert loaded["enforce-eager"] is True and loaded["max-log-len"] == "100"
    quantized = yaml.safe_load(yaml_export(values, **SEED_ARGS, checkpoint_quantized=True))
    assert "quantization" not in quantized


ENGINE_CHECK = r"""
import contextlib, io, json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

def parse(argv):
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    return {key: getattr(args, key) for key in sys.argv[2].split(",")}

request = json.load(open(sys.argv[1]))
out = {"cli": [parse(argv) for argv in request["argvs"]], "yaml": parse(["--config", request["yaml"]])}
try:
    with contextlib.redirect_stderr(io.StringIO()):
        parse(["--swap-space", "4"])
    out["swap_space"] = "accepted"
except SystemExit:
    out["swap_space"] = "refused"
print("RESULT " + json.dumps(out))
"""


@pytest.mark.engine  # vLLM's own parser, in ENGINE_PYTHON
def test_it_passes_vllms_own_argument_parser(tmp_path):
    on = seed_profile(served_model_name="qwen", extra_args="--enforce-eager --max-log-len 100",
                      tool_call_parser="hermes")
    off = seed_profile(quantization="none", quantization_bits=None, enable_prefix_caching=False,
                       enable_chunked_prefill=False, dtype="bfloat16", max_num_batched_tokens=16384)
    argvs = [launch_argv(values, model_path="/models/qwen", port=8000)[3:] for values in (on, off)]
    yaml_path = tmp_path / "profile.yaml"
    yaml_path.write_text(yaml_export(off, model_path="/models/qwen", port=8000))
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"argvs": argvs, "yaml": str(yaml_path)}))
    keys = ["model", "served_model_name", "dtype", "quantization", "max_model_len", "block_size",
            "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
            "enable_prefix_caching", "tensor_parallel_size", "pipeline_parallel_size", "host", "port",
            "enforce_eager", "max_log_len", "enable_auto_tool_choice", "tool_call_parser"]
    ran = subprocess.run([settings.ENGINE_PYTHON, "-c", ENGINE_CHECK, str(request), ",".join(keys)],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, VLLM_LOGGING_LEVEL="ERROR"))
    lines = [line for line in ran.stdout.splitlines() if line.startswith("RESULT ")]
    assert ran.returncode == 0 and lines, ran.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    expected = {"model": "/models/qwen", "dtype": "float16", "quantization": "awq", "max_model_len": 8192,
                "block_size": 16, "gpu_memory_utilization": 0.9, "max_num_seqs": 256,
                "max_num_batched_tokens": 8192, "enable_chunked_prefill": True, "enable_prefix_caching": True,
                "tensor_parallel_size": 2, "pipeline_parallel_size": 1, "host": "127.0.0.1", "port": 8000,
                "served_model_name": ["qwen"], "enforce_eager": True, "max_log_len": 100,
                "enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    assert result["cli"][0] == expected
    expected_off = {**expected, "served_model_name": ["Qwen/Qwen2.5-14B-Instruct"], "quantization": None,
                    "dtype": "bfloat16", "enable_prefix_caching": False, "enable_chunked_prefill": False,
                    "max_num_batched_tokens": 16384, "enforce_eager": False, "max_log_len": None,
                    "enable_auto_tool_choice": False, "tool_call_parser": None}
    assert result["cli"][1] == expected_off
    assert result["yaml"] == expected_off
    assert result["swap_space"] == "refused"


def test_profiles_that_asked_for_tool_calling_in_extra_args_keep_it_as_the_setting(db, team_setup):
    import importlib

    from django.apps import apps

    from panel.registry.models import RegisteredModel
    from panel.serving.models import ServingProfile

    migration = importlib.import_module("panel.serving.migrations.0006_profile_tool_call_parser")
    model = RegisteredModel.objects.create(
        team=team_setup["team_a"], name="qwen", path="/models/qwen", architecture="Qwen2ForCausalLM",
        model_type="qwen2", parameter_count=1, linear_parameter_count=1, num_layers=1, num_attention_heads=1,
        num_kv_heads=1, hidden_size=8, head_dim=8, max_position_embeddings=8, dtype="bfloat16", size_bytes=1)
    old = ServingProfile.objects.create(team=team_setup["team_a"], model=model, name="old",
                                        extra_args="--enforce-eager --enable-auto-tool-choice --tool-call-parser "
                                                   "hermes --max-log-len 10")
    plain = ServingProfile.objects.create(team=team_setup["team_a"], model=model, name="plain",
                                          extra_args="--enforce-eager")
    migration.move_tool_flags(apps, None)
    old.refresh_from_db(), plain.refresh_from_db()
    assert (old.tool_call_parser, old.extra_args) == ("hermes", "--enforce-eager --max-log-len 10")
    assert (plain.tool_call_parser, plain.extra_args) == ("", "--enforce-eager")
    assert validate_extra_args(old.extra_args) == ["--enforce-eager", "--max-log-len=10"]
