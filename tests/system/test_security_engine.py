"""Attack tests: a serving profile's extra_args is an allow-list of vLLM flags with checked values (none that writes
prompts to the log); engines start with a minimal environment that holds none of the panel's secrets; each
deployment's engine has its own key, which only the panel sends, and every path of the engine needs it (vLLM's own
check covers /v1 only)."""
import html
import importlib
import os
import sys

import httpx
import pytest
from django.conf import settings as django_settings

from panel.jobs import processes
from panel.serving.configfile import KEY_GUARD, ConfigFileError, deploy_script, launch_argv, validate_extra_args
from panel.serving.engine_flags import REFUSED
from panel.serving.supervisor import exposure_problem
from tests.support.waiting import run_coroutine

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


@pytest.mark.parametrize("extra", ["--host 0.0.0.0", "--port 9000", "--config other.yaml",
                                   "--tool-call-parser /tmp/plugin.py", "--enable-auto-tool-choice"])
def test_flags_the_profile_owns_stay_refused(extra):
    assert "which the profile already sets" in refused(extra)


@pytest.mark.parametrize("extra, words", [
    ("--trust-remote", "may not set --trust-remote"),  # argparse would take a prefix of --trust-remote-code
    ("--enable-lora", "which the profile already sets (the profile's LoRA settings)"),
    ("--chat-template /proc/self/environ", "inside the model's folder"),
    ("--chat-template /models/tiny/../other/t.jinja", "inside the model's folder"),
    ("--chat-template relative.jinja", "inside the model's folder"),
    ("--seed lots", "takes a whole number"),
    ("--max-num-seqs-not-a-flag 1000", "not among the engine flags Tokenwise allows"),
    ("--max-logprobs 1000000", "from -1 to 100000"),
    ("--cpu-offload-gb -1", "from 0 to 4096"),
    ("--kv-cache-dtype int3", "takes one of auto"),
    ("--load-format pt", "takes one of auto, safetensors"),
    ("--enforce-eager=yes", "takes no value"),
    ("--seed", "needs a value"),
    ("--speculative-config '{\"method\": \"draft_model\", \"model\": \"/other\"}'", "method\": \"ngram"),
    ("--speculative-config '{\"method\": \"ngram\", \"model\": \"/other\"}'", "does not take the key 'model'"),
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
    assert argv[-1] == "--no-enforce-eager" and f"--chat-template={template}" in argv
    assert "--seed=7" in argv and "--max-log-len=100" in argv
    assert validate_extra_args("--chat-template '{{ messages }}'")[-1] == "--chat-template={{ messages }}"


@pytest.mark.parametrize("extra", ["--enable-log-requests", "--enable_log_requests", "--enable-log-requests "
                                   "--enable-log-outputs", "--enforce-eager --enable-log-outputs"])
def test_flags_that_write_prompts_or_answers_to_the_engine_log_are_refused(extra):
    words = refused(extra)
    assert "may not set --enable" in words and "engine's log" in words


def test_the_profile_form_refuses_logging_requests_with_the_reason_and_saves_nothing(client, team_setup, tmp_path):
    from django.urls import reverse

    from panel.registry.models import RegisteredModel
    from panel.serving.models import ServingProfile

    model = RegisteredModel.objects.create(
        team=team_setup["team_a"], name="m", path=str(tmp_path), architecture="Qwen2ForCausalLM", model_type="qwen2",
        parameter_count=1, linear_parameter_count=1, num_layers=1, num_attention_heads=1, num_kv_heads=1,
        hidden_size=1, head_dim=1, max_position_embeddings=4096, dtype="bf16", size_bytes=1)
    client.force_login(team_setup["alice"])
    response = client.post(reverse("profile_create"), {
        "name": "chatty", "model": model.pk, "dtype": "auto", "quantization": "none", "max_model_len": 2048,
        "block_size": 32, "gpu_memory_utilization": 0.9, "swap_space": 0, "max_num_seqs": 16,
        "max_num_batched_tokens": 2048, "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
        "extra_args": "--enforce-eager --enable-log-requests"})
    page = html.unescape(response.content.decode())
    assert response.status_code == 400 and "field-error" in page
    assert "may not set --enable-log-requests: it writes every request to the engine's log" in page
    assert not ServingProfile.objects.exists()


def test_a_profile_saved_with_a_flag_refused_since_cannot_launch_and_says_why(client, team_setup, tmp_path):
    from django.core.exceptions import ValidationError
    from django.urls import reverse
    from django.utils import timezone

    from panel.hosts.models import WorkerHost
    from panel.registry.models import RegisteredModel
    from panel.serving.models import ServingProfile
    from panel.serving.services import deployment_launch, profile_check

    model = RegisteredModel.objects.create(
        team=team_setup["team_a"], name="m", path=str(tmp_path), architecture="Qwen2ForCausalLM", model_type="qwen2",
        parameter_count=1, linear_parameter_count=1, num_layers=1, num_attention_heads=1, num_kv_heads=1,
        hidden_size=1, head_dim=1, max_position_embeddings=4096, dtype="bf16", size_bytes=1)
    profile = ServingProfile.objects.create(team=team_setup["team_a"], name="old", model=model, max_model_len=2048,
                                            extra_args="--enable-log-requests")  # saved before it was refused
    assert "may not set --enable-log-requests" in " ".join(profile_check(profile).errors["extra_args"])
    WorkerHost.objects.create(name="gpu@h", host="h", kind="gpu", queues=["gpu", "gpu.h"], last_seen=timezone.now(),
                              memory_available_bytes=64 * 2 ** 30)
    with pytest.raises(ValidationError, match="enable-log-requests"):
        deployment_launch(team=team_setup["team_a"], user=None, profile=profile, enqueue=False)
    assert not profile.deployments.exists()
    client.force_login(team_setup["alice"])
    page = client.get(reverse("profile_detail", args=[profile.pk]))
    assert page.status_code == 200 and "Cannot launch until the profile is edited" in page.content.decode()
    export = client.get(reverse("profile_export", args=[profile.pk, "sh"]), follow=True)
    assert "--enable-log-requests" in html.unescape(export.content.decode()) and export.redirect_chain


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


@pytest.mark.engine
def test_a_deployed_engine_has_its_own_key_on_every_path_and_none_of_the_panels_secrets(launch_tiny, team_setup):
    from panel.channels.models import Channel, CredentialKind
    from panel.channels.services import channel_test
    from panel.dashboards.scraper import deployment_scrape

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

    # Nor past /v1: SageMaker's /invocations (the same generation), /tokenize, the Prometheus app on /metrics...
    server = root.removesuffix("/v1")
    chat = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    calls = [("POST", "/invocations", chat), ("POST", "/tokenize", {"model": "tiny-chat", "prompt": "hi"}),
             ("POST", "/detokenize", {"model": "tiny-chat", "tokens": [1, 2]}), ("GET", "/metrics", None),
             ("GET", "/health", None), ("GET", "/version", None), ("POST", "/pooling", {"input": "hi"})]
    for method, path, body in calls:
        for headers in ({}, {"Authorization": "Bearer not-the-key"}):
            answer = httpx.request(method, server + path, json=body, headers=headers, timeout=30)
            assert answer.status_code == 401, (path, headers, answer.status_code, answer.text[:200])
    with_key = {"Authorization": f"Bearer {key}"}
    answer = httpx.post(f"{server}/invocations", json=chat, headers=with_key, timeout=60)
    assert answer.status_code == 200 and answer.json()["choices"], answer.text[:300]
    answer = httpx.post(f"{server}/tokenize", json={"model": "tiny-chat", "prompt": "hi"}, headers=with_key,
                        timeout=30)
    assert answer.status_code == 200 and answer.json()["count"] > 0, answer.text[:300]
    assert "vllm:prompt_tokens" in httpx.get(f"{server}/metrics", headers=with_key, timeout=30).text
    # The panel's scraper sends the key: the deployment's engine samples are recorded.
    sample = deployment_scrape(deployment=deployment)
    assert sample.ok and sample.pk and sample.cumulative["counters"]["prompt_tokens"] > 0, sample.warning


# ------------------------------------------------------------------------------------- the key on every path

def test_every_engine_start_puts_every_path_behind_the_key(team_setup, tmp_path):
    from panel.registry.models import RegisteredModel
    from panel.serving.models import ServingProfile
    from panel.serving.services import launch_argv as panel_launch_argv

    model = RegisteredModel.objects.create(
        team=team_setup["team_a"], name="m", path=str(tmp_path), architecture="Qwen2ForCausalLM", model_type="qwen2",
        parameter_count=1, linear_parameter_count=1, num_layers=1, num_attention_heads=1, num_kv_heads=1,
        hidden_size=1, head_dim=1, max_position_embeddings=4096, dtype="bf16", size_bytes=1)
    profile = ServingProfile.objects.create(team=team_setup["team_a"], name="p", model=model, max_model_len=2048)
    argv = panel_launch_argv(profile, port=8001)
    assert f"--middleware={KEY_GUARD}" in argv and KEY_GUARD == "engine.api_key_guard.ApiKeyGuard"
    assert argv[1:3] == ["-m", "engine.serve"]  # vLLM's own parser checks the arguments first (engine/serve.py)
    assert "--middleware" in refused(f"--middleware {KEY_GUARD}")  # a profile cannot add or replace one


def call(guard, path, headers=(), kind="http"):
    """The guard's answer to one request: (status or close code, what reached the app)."""
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "path": path, "method": "GET",
             "headers": [(name.encode(), value.encode()) for name, value in headers]}
    run_coroutine(guard(app)(scope, receive, send))  # not asyncio.run: a browser test's loop may be running
    return sent[0].get("status", sent[0].get("code")), reached


def load_guard(monkeypatch, key):
    """engine/api_key_guard.py imported afresh, as the engine imports it, with VLLM_API_KEY=`key`."""
    monkeypatch.setenv("VLLM_API_KEY", key)
    monkeypatch.delitem(sys.modules, "engine.api_key_guard", raising=False)
    return importlib.import_module("engine.api_key_guard").ApiKeyGuard


def test_the_key_guard_refuses_any_path_without_the_key(monkeypatch):
    ApiKeyGuard = load_guard(monkeypatch, "engine-key-1234")
    for path in ("/invocations", "/tokenize", "/metrics", "/metrics/", "/health", "/v1/models", "/pooling"):
        assert call(ApiKeyGuard, path) == (401, []), path
        assert call(ApiKeyGuard, path, [("Authorization", "Bearer wrong")]) == (401, []), path
        assert call(ApiKeyGuard, path, [("Authorization", "engine-key-1234")]) == (401, []), path
        assert call(ApiKeyGuard, path, [("authorization", "bearer engine-key-1234")]) == (200, [path]), path
    assert call(ApiKeyGuard, "/v1/realtime", kind="websocket") == (1008, [])


def test_an_engine_without_a_key_refuses_to_start(monkeypatch):
    with pytest.raises(RuntimeError, match="refuses to start without a key"):
        load_guard(monkeypatch, "")


@pytest.mark.parametrize("host, env, words", [
    ("0.0.0.0", {}, "would listen on 0.0.0.0 without a key"),
    ("10.0.0.5", {"VLLM_API_KEY": ""}, "would listen on 10.0.0.5 without a key"),
    ("gpu-1.lan", {}, "without a key"),
    (None, {}, "would listen on every interface without a key"),
    ("0.0.0.0", {"VLLM_API_KEY": "k"}, None),
    ("127.0.0.1", {}, None),
    ("::1", {}, None),
    ("localhost", {}, None),
])
def test_an_engine_reachable_from_elsewhere_needs_its_key(host, env, words):
    argv = launch_argv({**SEED}, model_path="/models/m", port=8001, host=host or "x", key_guard=True)
    if host is None:
        argv.remove("--host=x")
    assert exposure_problem(argv, env) == "" if words is None else words in exposure_problem(argv, env)
    if env.get("VLLM_API_KEY"):  # a key that guards /v1 alone is not enough
        argv.remove(f"--middleware={KEY_GUARD}")
        assert "guarding only /v1" in exposure_problem(argv, env)
