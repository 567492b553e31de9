"""Attack tests: a serving profile's extra_args is an allow-list of vLLM flags with checked values; engines start
with a minimal environment that holds none of the panel's secrets; each deployment's engine has its own key, which
only its local channel sends."""
import os
import sys

import httpx
import pytest
from django.conf import settings as django_settings

from panel.jobs import processes
from panel.serving.configfile import ConfigFileError, deploy_script, launch_argv, validate_extra_args
from panel.serving.engine_flags import REFUSED

SEED = dict(model_name="m", served_model_name="m", extra_args="")


def refused(extra, model_path="/models/tiny"):
    with pytest.raises(ConfigFileError) as caught:
        launch_argv({**SEED, "extra_args": extra}, model_path=model_path, port=8001)
    return " ".join(caught.value.problems)


@pytest.mark.parametrize("flag", sorted(set(REFUSED) - {"--host", "--port", "--config"}))
def test_every_refused_flag_is_refused_with_its_reason(flag):
    words = refused(f"{flag} x")
    assert f"may not set {flag}" in words and REFUSED[flag] in words
    assert flag in refused(f"{flag}=x") and flag.replace("-", "_")[2:] in refused(f"--{flag[2:].replace('-', '_')} x")


@pytest.mark.parametrize("extra", ["--host 0.0.0.0", "--port 9000", "--config other.yaml"])
def test_flags_the_profile_owns_stay_refused(extra):
    assert "which the profile already sets" in refused(extra)


@pytest.mark.parametrize("extra, words", [
    ("--trust-remote", "may not set --trust-remote"),  # argparse would take a prefix of --trust-remote-code
    ("--enable-lora", "not among the engine flags Tokenwise allows"),
    ("--chat-template /proc/self/environ", "inside the model's folder"),
    ("--chat-template /models/tiny/../other/t.jinja", "inside the model's folder"),
    ("--chat-template relative.jinja", "inside the model's folder"),
    ("--seed lots", "takes a whole number"),
    ("--max-num-partial-prefills 1000", "from 1 to 64"),
    ("--cpu-offload-gb -1", "from 0 to 4096"),
    ("--kv-cache-dtype int3", "takes one of auto"),
    ("--load-format pt", "takes one of auto, safetensors"),
    ("--enforce-eager=yes", "takes no value"),
    ("--seed", "needs a value"),
    ("--speculative-config '{\"method\": \"draft_model\", \"model\": \"/other\"}'", "method\": \"ngram"),
    ("--speculative-config '{\"method\": \"ngram\", \"model\": \"/other\"}'", "does not take the key 'model'"),
    ("--tool-call-parser /tmp/plugin.py", "takes one of"),
])
def test_values_are_checked(extra, words):
    assert words in refused(extra)


def test_allowed_flags_pass(tmp_path):
    template = tmp_path / "model" / "template.jinja"
    template.parent.mkdir()
    template.write_text("{{ messages }}")
    extra = (f"--enforce-eager --seed 7 --max_log_len=100 --kv-cache-dtype fp8 --chat-template {template} "
             "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}' --no-enforce-eager")
    argv = launch_argv({**SEED, "extra_args": extra}, model_path=str(template.parent), port=8001)
    assert argv[-1] == "--no-enforce-eager" and str(template) in argv
    assert validate_extra_args("--chat-template '{{ messages }}'")[-1] == "{{ messages }}"


def test_the_launch_preview_shows_a_placeholder_for_the_engine_key():
    script = deploy_script({**SEED}, model_path="/models/m", port=8001)
    assert "VLLM_API_KEY=<engine key>" in script and "--api-key" not in script


# ------------------------------------------------------------------------------------------------ environment

def test_the_engine_environment_holds_no_panel_secret(monkeypatch):
    monkeypatch.setenv("TOKENWISE_UPSTREAM_PROVIDER", "sk-upstream-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    env = processes.engine_environment({"CUDA_VISIBLE_DEVICES": "0", "SECRET_KEY": "smuggled"})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "auto" and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["PATH"] == os.environ["PATH"] and env["HF_HUB_OFFLINE"] == "1"
    for name in ("SECRET_KEY", "TOKENWISE_ENCRYPTION_KEYS", "DATABASE_URL", "REDIS_URL", "TOKENWISE_DATA_DIR",
                 "TOKENWISE_UPSTREAM_PROVIDER", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DJANGO_SETTINGS_MODULE"):
        assert name not in env, name


def test_a_real_engine_subprocess_starts_without_the_panels_secrets(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://tokenwise:db-password-canary@db/tokenwise")
    lines = []
    code = "import os; print(open(f'/proc/{os.getpid()}/environ', 'rb').read().decode().replace(chr(0), chr(10)))"
    outcome = processes.run_streaming([sys.executable, "-c", code], on_line=lines.append, tick=lambda: False,
                                      time_limit=30)
    assert outcome.returncode == 0 and any(line.startswith("PATH=") for line in lines)
    environ = "\n".join(lines)
    for value in (django_settings.SECRET_KEY, os.environ["TOKENWISE_ENCRYPTION_KEYS"], "db-password-canary",
                  os.environ["REDIS_URL"]):
        assert value not in environ


def test_a_deployed_engine_has_its_own_key_and_none_of_the_panels_secrets(launch_tiny, team_setup):
    from panel.channels.models import Channel, CredentialKind
    from panel.channels.services import channel_test

    deployment = launch_tiny(team_setup["team_a"])
    root = deployment.base_url.rstrip("/")
    with open(f"/proc/{deployment.pid}/environ", "rb") as handle:
        environ = handle.read().decode(errors="replace")
    for value in (django_settings.SECRET_KEY, os.environ["TOKENWISE_ENCRYPTION_KEYS"], os.environ["REDIS_URL"],
                  django_settings.DATABASES["default"]["NAME"]):
        assert value not in environ
    key = deployment.engine_key()
    assert len(key) >= 32 and f"VLLM_API_KEY={key}" in environ
    assert key not in " ".join(deployment.command) and key not in deployment.engine_key_ciphertext
    # Another team's channel pointed at this port gets nothing without the key.
    assert httpx.get(f"{root}/models", timeout=10).status_code == 401
    channel = Channel.objects.get(team=team_setup["team_a"], deployment=deployment)
    assert channel.credential_kind == CredentialKind.STORED and channel.api_key() == key
    assert channel_test(channel)["ok"]
