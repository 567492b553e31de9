"""Attack tests: a member may not run code on a GPU host through a serving profile's extra arguments.

vLLM 0.32's parser rewrites any token that starts with "-" and holds a "." into a dotted config option
(`-cc.X` becomes `--compilation-config`), and argparse reads an unknown `--flag= value` as a positional word. A
chat-template "value" that is really `-cc.inductor_compile_config=...` (with `{{` inside, so it looked like a
template) followed by an allowed flag vLLM does not know, written `--flag= 2`, set an inductor compile option whose
compiler command is a shell. The panel now writes every value into its flag's token, refuses values that start
with "-", chat templates that do not parse, and flags the host's vLLM does not know; the engine is started through
engine/serve.py, which refuses any option that vLLM would set but no flag names."""
import json
import shlex
import subprocess

import pytest
from django.conf import settings

from panel.hosts.models import EngineCheck
from panel.jobs.models import JobState
from panel.serving.configfile import CHECKED_SERVER_MODULE, ConfigFileError, launch_argv, validate_extra_args
from panel.serving.engine_flags import ALLOWED
from panel.serving.services import profile_check

# The attack as a member would type it into the profile's "Extra engine arguments".
ATTACK = ("--chat-template "
          "'-cc.inductor_compile_config={\"cpp.cxx\": [\"/bin/sh\", \"-c\", \"touch /tmp/pwned #{{\"]}' "
          "'--max-num-partial-prefills= 2'")
SEED = dict(model_name="m", served_model_name="m", extra_args="")
# Allowed flags that vLLM 0.32 does not know (read from its own parser): argparse would take `--flag= x` as a word.
UNKNOWN_TO_VLLM_032 = ["--disable-frontend-multiprocessing", "--disable-log-requests",
                       "--max-long-partial-prefills", "--max-num-partial-prefills"]


def problems_of(extra, **keywords):
    with pytest.raises(ConfigFileError) as caught:
        validate_extra_args(extra, model_path="/models/tiny", **keywords)
    return " ".join(caught.value.problems)


def test_the_compile_config_smuggled_through_a_chat_template_is_refused_with_the_reason():
    words = problems_of(ATTACK)
    assert 'the value of --chat-template may not start with "-"' in words
    assert "--max-num-partial-prefills" in words


@pytest.mark.parametrize("flag", UNKNOWN_TO_VLLM_032)
def test_allowed_flags_that_vllm_does_not_know_are_no_longer_allowed(flag):
    assert flag not in ALLOWED
    assert "is not among the engine flags Tokenwise allows" in problems_of(f"{flag}=2")


@pytest.mark.parametrize("extra, words", [
    ("--chat-template '{{ messages'", "is not a Jinja template"),
    ("--chat-template '{% for m in messages %}'", "is not a Jinja template"),
    ("--seed --enforce-eager", "--seed needs a value"),
    ("--response-role -cc.x", 'may not start with "-"'),
    ("--chat-template=-O3 --enforce-eager", 'may not start with "-"'),
])
def test_values_that_vllm_could_read_as_options_or_that_are_no_template_are_refused(extra, words):
    assert words in problems_of(extra)


def test_every_value_travels_in_its_flags_token():
    argv = launch_argv({**SEED, "extra_args": "--seed -3 --max-log-len 100 --chat-template '{{ x }} -cc.a=1' "
                                              "--enforce-eager"},
                       model_path="/models/tiny", port=8001, key_guard=True)
    assert argv[:3] == ["python", "-m", CHECKED_SERVER_MODULE]
    assert argv[3:5] == ["--middleware=engine.api_key_guard.ApiKeyGuard", "--allowed-media-domains=media.invalid"]
    assert "--model=/models/tiny" in argv and "--port=8001" in argv and "--host=127.0.0.1" in argv
    assert argv[-4:] == ["--seed=-3", "--max-log-len=100", "--chat-template={{ x }} -cc.a=1", "--enforce-eager"]
    assert all(token.startswith("--") for token in argv[3:])


def test_a_flag_the_hosts_vllm_does_not_know_is_refused_by_its_engine_check(team_setup, tmp_path):
    from django.core.exceptions import ValidationError
    from django.utils import timezone

    from panel.hosts.models import WorkerHost
    from panel.registry.models import RegisteredModel
    from panel.serving.models import ServingProfile
    from panel.serving.services import deployment_launch

    team = team_setup["team_a"]
    model = RegisteredModel.objects.create(
        team=team, name="m", path=str(tmp_path), architecture="Qwen2ForCausalLM", model_type="qwen2",
        parameter_count=1, linear_parameter_count=1, num_layers=1, num_attention_heads=1, num_kv_heads=1,
        hidden_size=1, head_dim=1, max_position_embeddings=4096, dtype="bf16", size_bytes=1)
    profile = ServingProfile.objects.create(team=team, name="p", model=model, max_model_len=2048,
                                            extra_args="--enforce-eager --max-log-len 10")
    host = WorkerHost.objects.create(name="gpu@h", host="h", kind="gpu", queues=["gpu", "gpu.h"],
                                     last_seen=timezone.now(), memory_available_bytes=64 * 2 ** 30)
    assert "extra_args" not in profile_check(profile, host).errors  # no engine check has listed its flags yet
    EngineCheck.objects.create(team=team, host=host, queue="gpu.h", state=JobState.SUCCEEDED,
                               finished_at=timezone.now(), result={"engine_flags": ["--seed", "--enforce-eager"]})
    words = " ".join(profile_check(profile, host).errors["extra_args"])
    assert "--max-log-len is not a flag of this host's vLLM" in words
    with pytest.raises(ValidationError, match="max-log-len is not a flag of this host"):
        deployment_launch(team=team, user=None, profile=profile, enqueue=False)
    assert not profile.deployments.exists()
    profile.extra_args = "--enforce-eager --seed 1"
    profile.save()
    assert "extra_args" not in profile_check(profile, host).errors


# In the engine venv, one import of vLLM for every case: what its own server parser makes of each argv
# (engine/serve.py's check), and what the checked entry point does with the last one.
READ_IN_ENGINE = """
import contextlib, io, json, sys
from engine import serve
parser = serve.server_parser()
argvs = json.loads(sys.stdin.read())
reads = [dict(zip(("problems", "set"), serve.check(argv, parser))) for argv in argvs]
words = io.StringIO()
with contextlib.redirect_stderr(words):
    status = serve.main(argvs[-1])
print(json.dumps({"reads": reads, "status": status, "stderr": words.getvalue()}, default=str))
"""


def engine_reads(argvs):
    done = subprocess.run([settings.ENGINE_PYTHON, "-c", READ_IN_ENGINE], input=json.dumps(argvs),
                          capture_output=True, text=True, timeout=300, cwd=settings.BASE_DIR)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.engine
def test_vllms_own_parser_reads_no_compile_config_from_the_panels_argv_and_the_engine_refuses_the_old_one():
    # The panel's argv for a profile whose template holds the same words, inside its value where they cannot act.
    extra = "--enforce-eager --chat-template '{{ messages }} -cc.inductor_compile_config={\"cpp.cxx\": \"sh\"}'"
    argv = launch_argv({**SEED, "extra_args": extra}, model_path="/models/tiny", port=8001, key_guard=True)
    # The tokens the attack gave yesterday's panel, and a dotted option that vLLM would set though no flag names it.
    old = ["--model", "/models/tiny", "--port", "8001", *shlex.split(ATTACK)]
    sneaky = ["--model=/models/tiny", "-cc.inductor_compile_config={\"cpp.cxx\": [\"/bin/sh\", \"-c\", \"exit 0\"]}"]
    engine = engine_reads([argv[3:], old, sneaky])
    panels, olds, sneakys = engine["reads"]
    assert panels["problems"] == []
    assert "compilation_config" not in panels["set"]
    assert panels["set"]["chat_template"].startswith("{{ messages }} -cc.inductor_compile_config=")
    assert panels["set"]["port"] == 8001 and panels["set"]["enforce_eager"] is True
    # A multimodal engine may fetch no URL a request names: the one domain allowed does not resolve.
    assert panels["set"]["allowed_media_domains"] == ["media.invalid"]
    assert any("is not written as --flag or --flag=value" in problem for problem in olds["problems"])
    assert any("--max-num-partial-prefills is not an option of this vLLM" in problem for problem in olds["problems"])
    assert any("-cc.inductor_compile_config" in problem for problem in sneakys["problems"])
    # The checked entry point does not start vLLM on arguments it refuses.
    assert engine["status"] == 1 and "tokenwise: the engine was not started" in engine["stderr"]


@pytest.mark.parametrize("extra", ["--allowed-media-domains example.com", "--allowed-local-media-path /"])
def test_a_profile_cannot_let_its_engine_fetch_media_urls_or_read_host_files(extra):
    words = problems_of(extra)
    assert "fetch URLs" in words or "read files of the host" in words


def test_a_deployment_the_checked_entry_point_refused_says_why_in_words():
    from panel.serving.supervisor import classify_engine

    tail = ["tokenwise: the engine was not started: vLLM would set compilation_config = {'cpp.cxx': 'sh'}, which no "
            "flag of the command names"]
    kind, reason = classify_engine(tail, 1)
    assert kind == "bad_config"
    assert reason == ("the engine refused its configuration: vLLM would set compilation_config = {'cpp.cxx': 'sh'}, "
                      "which no flag of the command names")
