"""LoRA adapters end to end on the real CPU engine ([0098]) with the real model: an adapter trained on SmolLM2 (a
real PEFT adapter that answers one question with a fixed phrase; panel/registry/demo_adapter.py, trained once per
run on the run's converted SmolLM2, tests/support/smollm2.py) is registered on its base, checked against it (on the
demo model, of another width, it is refused in words), served by a deployment of the base started with it
(--enable-lora, --max-loras, --max-lora-rank, --lora-modules), and reached through the gateway on a route of its own:
its answer differs from the base's, on its route, as a Compare column beside the base's, and on an evaluation set
run on both routes (the adapter says the phrase, the base does not); its usage row names the adapter's served name
and its channel on the deployment, and the GPU time is shared with it by tokens. A second registration of the same
files is loaded at run time through vLLM's endpoint (behind the engine's key), answers, and is unloaded: its route
then has no engine to go to and the engine no longer lists it."""
import time
from decimal import Decimal

import httpx
import openai
import pytest
from django.core.exceptions import ValidationError

from panel.accounts.keys import key_issue
from panel.channels.models import Channel, Route
from panel.dashboards.local_cost import local_cost_allocate
from panel.dashboards.models import MINUTE, UsageRollup
from panel.hosts.models import WorkerHost
from panel.jobs.services import job_cancel
from panel.registry.adapters import adapter_register
from panel.registry.demo_adapter import build_demo_adapter
from panel.registry.demo_model import build_demo_model
from panel.registry.models import LoraAdapter
from panel.registry.services import model_register
from panel.serving.adapters import adapter_load, adapter_unload, profile_lora_set
from panel.serving.models import Deployment, DeploymentAdapter, DeploymentState, ServingProfile
from panel.serving.services import deployment_launch
from panel.usage.models import RequestLog
from tests.support.compare import Panel
from tests.support.gateway_server import GatewayServer
from tests.support.smollm2 import smollm2_folder
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# SmolLM2 learns the phrase in 30 steps at 3e-3 (40 s on 2 quiet cores); the demo model's 40 at 1e-2 left it at a
# loss of 2.8, answering "The".
SMOLLM2_TRAINING = {"steps": 30, "learning_rate": 3e-3}


def ask(client, model, question):
    answer = client.chat.completions.create(model=model, temperature=0, max_tokens=16,
                                            messages=[{"role": "user", "content": question}])
    return answer.choices[0].message.content


def test_an_adapter_is_registered_served_beside_its_base_routed_and_billed(smollm2, start_worker, team_setup,
                                                                           tmp_path):
    from django.db import connection

    team = team_setup["team_a"]
    smol = model_register(team=team, user=None, source=str(smollm2_folder()), name="smol")
    job_cancel(smol.check_jobs.get(), actor=None, reason="the run's conversion: checked by the GGUF import tests")
    training = build_demo_adapter(tmp_path / "answers", base=smollm2_folder(), **SMOLLM2_TRAINING)
    # The same files under a second name, loaded at run time.
    build_demo_adapter(tmp_path / "answers-again", base=smollm2_folder(), **SMOLLM2_TRAINING)
    assert "forty-two" in training["adapter_answer"] and "forty-two" not in training["base_answer"], training

    build_demo_model(tmp_path / "tiny")
    tiny = model_register(team=team, user=None, source=str(tmp_path / "tiny"), name="tiny")
    with pytest.raises(ValidationError) as refused:
        adapter_register(team=team, user=None, base=tiny, source=str(tmp_path / "answers"))
    assert "hidden size 576, and tiny (qwen2) has 256" in refused.value.messages[0]
    assert not LoraAdapter.objects.exists()
    answers = adapter_register(team=team, user=None, base=smol, source=str(tmp_path / "answers"),
                               served_name="smol-answers")
    again = adapter_register(team=team, user=None, base=smol, source=str(tmp_path / "answers-again"),
                             served_name="smol-answers-2")
    assert (answers.rank, answers.hidden_size, answers.target_modules) == (8, 576, sorted(training["target_modules"]))

    profile = ServingProfile.objects.create(team=team, model=smol, name="smol-cpu", served_model_name="smol-chat",
                                            max_model_len=2048, block_size=32, max_num_seqs=8,
                                            max_num_batched_tokens=2048, extra_args="--enforce-eager")
    profile_lora_set(profile=profile, max_loras=2, max_lora_rank=8, adapters=[answers])
    start_worker("gpu")
    host = wait_until(lambda: WorkerHost.objects.filter(kind="gpu", last_seen__isnull=False).first(),
                      message="worker")
    WorkerHost.objects.filter(pk=host.pk).update(gpu_price_per_hour=Decimal("3.6"))
    deployment = deployment_launch(team=team, user=None, profile=profile)
    wait_until(lambda: Deployment.objects.get(pk=deployment.pk).state in (DeploymentState.READY,
                                                                          DeploymentState.FAILED),
               seconds=300, interval=0.5, message="the deployment")
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.READY, deployment.failure_reason
    assert f"--lora-modules=smol-answers={answers.path}" in deployment.command
    assert DeploymentAdapter.objects.get(deployment=deployment).adapter == answers
    channel = Channel.objects.get(deployment=deployment, model_id="smol-answers")
    assert channel.enabled and Route.objects.get(team=team, model_name="smol-answers").ordered_channels() == [channel]

    _, key = key_issue(team=team, user=None, name="app")
    gateway = GatewayServer(connection.settings_dict["NAME"])
    try:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=120)
        base_answer = ask(client, "smol-chat", training["question"])
        adapter_answer = ask(client, "smol-answers", training["question"])
        assert adapter_answer != base_answer, (adapter_answer, base_answer)

        # Loaded at run time under a second name, through vLLM's endpoint with the engine's key (without it: 401).
        refused = httpx.post(f"{deployment.base_url}/load_lora_adapter", timeout=10,
                             json={"lora_name": "x", "lora_path": again.path})
        assert refused.status_code == 401
        adapter_load(deployment=deployment, adapter=again)
        time.sleep(0.6)  # the route reaches the gateway within 0.5 s
        assert ask(client, "smol-answers-2", training["question"]) == adapter_answer
        with pytest.raises(ValidationError, match="already loaded"):
            adapter_load(deployment=deployment, adapter=again)
        adapter_unload(deployment=deployment, adapter=again)
        time.sleep(0.6)
        with pytest.raises(openai.APIStatusError) as gone:
            ask(client, "smol-answers-2", training["question"])
        assert gone.value.status_code in (404, 503), gone.value
        listed = httpx.get(f"{deployment.base_url}/models", timeout=10,
                           headers={"Authorization": f"Bearer {deployment.engine_key()}"}).json()
        assert {entry["id"] for entry in listed["data"]} == {"smol-chat", "smol-answers"}
    finally:
        gateway.stop()
    compare_base_and_adapter(team_setup["alice"], deployment, channel, training["question"],
                             expected=(base_answer, adapter_answer))
    evaluate_adapter_against_base(team, team_setup["alice"], start_worker, training)

    # Its gateway request's row (Compare's and the evaluation run's are recorded too, under their endpoints).
    rows = RequestLog.objects.filter(model="smol-answers")
    wait_until(lambda: rows.filter(endpoint="compare").exists(), message="the adapter's rows")
    row = rows.get(endpoint="chat")
    assert (row.channel_id, row.outcome, row.completion_tokens > 0) == (channel.pk, "ok", True)
    served = RequestLog.objects.filter(channel__deployment=deployment)

    def allocated():
        """Every minute of these requests settled; a row its writer (a worker's, Compare's) wrote after a run is
        found by the next run, as beat's next run finds it."""
        local_cost_allocate(now=time.time() + 180)
        return not served.filter(gpu_cost__isnull=True).exists()

    wait_until(allocated, seconds=30, interval=1, message="every row of the deployment's channels allocated")
    row.refresh_from_db()
    assert row.gpu_cost > 0 and row.cost == row.gpu_cost, (row.gpu_cost, row.cost)
    assert all(base.gpu_cost > 0 for base in RequestLog.objects.filter(model="smol-chat"))
    # Usage by model (the dashboards' roll-ups) shows the adapter as a model of its own, on the deployment, with its
    # share of the GPU time.
    rolled = UsageRollup.objects.filter(model="smol-answers", period=MINUTE)
    assert rolled.exists() and {(r.deployment_id, r.local) for r in rolled} == {(deployment.pk, True)}
    assert sum(r.cost for r in rolled) == pytest.approx(float(sum(r.cost for r in rows.all())))


def compare_base_and_adapter(user, deployment, adapter_channel, question, *, expected):
    """Compare with an adapter column: the base's channel and the adapter's side by side, one engine behind both,
    each column answering as its own model does through the gateway."""
    base_channel = Channel.objects.get(deployment=deployment, model_id="smol-chat")
    columns = [f"channel:{base_channel.pk}", f"channel:{adapter_channel.pk}"]
    panel = Panel(user)
    try:
        page = panel.http.get("/compare/")
        assert all(f'"{key}"' in page.text for key in columns)  # both offered as columns
        sent = panel.post("/compare/send/", {"columns": columns, "message": question, "max_tokens": 16,
                                             "temperature": 0})
        assert sent.status_code == 200, sent.text
        texts = []
        for column in sent.json()["columns"]:
            done = panel.events(column["stream_url"])[-1]
            assert done["ok"] is True, done
            texts.append(done["text"])
    finally:
        panel.close()
    assert tuple(texts) == expected, (texts, expected)


def evaluate_adapter_against_base(team, user, start_worker, training):
    """An evaluation set run on the adapter's route and on the base's: the one case that asks for the phrase passes
    on the adapter and fails on the base."""
    import json

    from panel.evaluations.models import EvalRun
    from panel.evaluations.runs import eval_run_launch
    from panel.evaluations.services import eval_set_create

    case = {"id": "phrase", "prompt": training["question"], "max_tokens": 24,
            "checks": [{"type": "contains", "text": "forty-two"}]}
    eval_set = eval_set_create(team=team, user=user, name="the adapter's phrase", text=json.dumps(case))
    start_worker("long")
    runs = {model: eval_run_launch(team=team, user=user, eval_set=eval_set,
                                   candidate=f"route:{Route.objects.get(team=team, model_name=model).pk}")
            for model in ("smol-answers", "smol-chat")}
    wait_until(lambda: all(EvalRun.objects.get(pk=run.pk).is_final for run in runs.values()), seconds=180,
               interval=0.5, message="the evaluation runs")
    passed = {}
    for model, run in runs.items():
        run.refresh_from_db()
        assert run.state == "succeeded", (run.failure_kind, run.failure_reason)
        passed[model] = run.result["passed"]
    assert passed == {"smol-answers": 1, "smol-chat": 0}, [run.results for run in runs.values()]
