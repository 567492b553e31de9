"""The API's long-running work beyond single runs: config ladders and sweeps (start, follow, cancel), the Workers
page's hosts and engine checks, and cancelling a quality report (on the page and by API)."""
import json

import pytest
from django.urls import reverse
from django.utils import timezone

from panel.audit.models import AuditAction, AuditEvent
from panel.benchmarks.models import Ladder, Sweep
from panel.hosts.models import EngineCheck, WorkerHost
from panel.registry.models import EvaluationJob, RegisteredModel
from panel.serving.models import ServingProfile
from tests.support.api_helpers import bearer, token_for

API = "/api/v1"
FACTS = dict(architecture="Qwen2ForCausalLM", model_type="qwen2", parameter_count=5_000_000,
             linear_parameter_count=4_000_000, num_layers=4, num_attention_heads=4, num_kv_heads=2, hidden_size=256,
             head_dim=64, max_position_embeddings=4096, dtype="float16", size_bytes=10_000_000)


def call(client, method, path, raw, body=None):
    kwargs = {"content_type": "application/json", "data": json.dumps(body)} if body is not None else {}
    return getattr(client, method)(API + path, **kwargs, **bearer(raw))


@pytest.fixture
def setup(team_setup, tmp_path):
    team = team_setup["team_a"]
    model = RegisteredModel.objects.create(team=team, name="tiny", path=str(tmp_path), **FACTS)
    host = WorkerHost.objects.create(name="gpu@box", host="box", kind="gpu", queues=["gpu", "gpu.box"], cpu_count=2,
                                     memory_bytes=16 << 30, memory_available_bytes=12 << 30, last_seen=timezone.now())
    return {**team_setup, "model": model, "host": host, "owner": token_for(team_setup["alice"], team),
            "viewer": token_for(team_setup["vera"], team), "other": token_for(team_setup["bob"], team_setup["team_b"])}


def test_a_ladder_is_refused_in_words_started_followed_and_cancelled(client, setup):
    model_id = setup["model"].pk
    bad = call(client, "post", "/ladders", setup["owner"], {"model": model_id, "small_max_num_seqs": 8,
                                                            "large_max_num_seqs": 4, "max_model_len": 9000})
    assert bad.status_code == 400
    assert set(bad.json()["errors"]) >= {"large_max_num_seqs", "max_model_len"}, bad.json()
    assert not Ladder.objects.exists()
    assert call(client, "post", "/ladders", setup["viewer"], {"model": model_id}).status_code == 403

    made = call(client, "post", "/ladders", setup["owner"], {"model": model_id, "small_max_num_seqs": 2,
                                                             "large_max_num_seqs": 16, "max_model_len": 1024})
    assert made.status_code == 201, made.content
    ladder_id = made.json()["id"]
    assert made.json()["state"] == "pending" and Ladder.objects.get(pk=ladder_id).host == setup["host"]
    detail = call(client, "get", f"/ladders/{ladder_id}", setup["viewer"]).json()
    assert [step["key"] for step in detail["steps"]][:2] == ["baseline", "awq"]
    assert {step["status"] for step in detail["steps"]} == {"pending"}
    assert [ladder["id"] for ladder in call(client, "get", "/ladders", setup["viewer"]).json()] == [ladder_id]
    assert call(client, "get", f"/ladders/{ladder_id}", setup["other"]).status_code == 404
    assert call(client, "post", f"/ladders/{ladder_id}/cancel", setup["other"]).status_code == 404
    cancelled = call(client, "post", f"/ladders/{ladder_id}/cancel", setup["owner"])
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert AuditEvent.objects.filter(action=AuditAction.JOB_CANCELLED, target=f"ladder #{ladder_id}").count() == 1


def test_a_sweep_is_started_read_and_cancelled(client, setup):
    profile = ServingProfile.objects.create(team=setup["team_a"], name="p", model=setup["model"], max_model_len=1024,
                                            block_size=32)
    bad = call(client, "post", "/sweeps", setup["owner"], {"profile": profile.pk, "values": "4, many"})
    assert bad.status_code == 400 and "values" in bad.json()["errors"] and not Sweep.objects.exists()
    made = call(client, "post", "/sweeps", setup["owner"], {"profile": profile.pk, "values": "2, 8",
                                                            "p99_target_ms": 3000})
    assert made.status_code == 201, made.content
    sweep_id = made.json()["id"]
    assert made.json()["values"] == [2, 8]
    detail = call(client, "get", f"/sweeps/{sweep_id}", setup["viewer"]).json()
    assert detail["best"] is None and detail["points"] == []
    assert call(client, "get", f"/sweeps/{sweep_id}", setup["other"]).status_code == 404
    assert call(client, "post", f"/sweeps/{sweep_id}/cancel", setup["viewer"]).status_code == 403
    assert call(client, "post", f"/sweeps/{sweep_id}/cancel", setup["owner"]).json()["state"] == "cancelled"


def test_hosts_and_engine_checks_by_api(client, setup):
    offline = WorkerHost.objects.create(name="gpu@off", host="off", kind="gpu", queues=["gpu", "gpu.off"])
    hosts = {host["host"]: host for host in call(client, "get", "/hosts", setup["viewer"]).json()}
    assert hosts["box"]["online"] and not hosts["off"]["online"] and hosts["box"]["engine_check"] is None
    refused = call(client, "post", f"/hosts/{offline.pk}/engine-checks", setup["owner"])
    assert refused.status_code == 400 and "offline" in refused.json()["detail"]
    assert call(client, "post", f"/hosts/{setup['host'].pk}/engine-checks", setup["viewer"]).status_code == 403
    assert not EngineCheck.objects.exists()

    started = call(client, "post", f"/hosts/{setup['host'].pk}/engine-checks", setup["owner"])
    assert started.status_code == 201 and started.json()["state"] == "pending"
    check = EngineCheck.objects.get(pk=started.json()["id"])
    assert check.queue == "gpu.box"
    assert call(client, "get", f"/engine-checks/{check.pk}", setup["other"]).status_code == 404
    EngineCheck.objects.filter(pk=check.pk).update(state="succeeded", finished_at=timezone.now(),
                                                   result={"serves_awq": True})
    hosts = {host["host"]: host for host in call(client, "get", "/hosts", setup["viewer"]).json()}
    assert hosts["box"]["engine_check"]["id"] == check.pk
    assert hosts["box"]["engine_check"]["result"] == {"serves_awq": True}
    assert call(client, "get", f"/engine-checks/{check.pk}", setup["viewer"]).json()["events"][0]["to_state"] == (
        "pending")



def test_a_hosts_gpu_price_is_set_by_api_by_a_superuser_only_validated_and_audited(client, setup):
    host, path = setup["host"], f"/hosts/{setup['host'].pk}/gpu-price"
    price = {"gpu_price_per_hour": "1.25", "gpu_count": 2}
    for raw in (setup["owner"], setup["viewer"]):  # a team's owner is not the installation's superuser
        refused = call(client, "put", path, raw, price)
        assert refused.status_code == 403, refused.content
    assert "only a superuser" in call(client, "put", path, setup["owner"], price).json()["detail"]
    assert AuditEvent.objects.filter(action=AuditAction.REFUSED, target=API + path).count() == 3
    host.refresh_from_db()
    assert (host.gpu_price_per_hour, host.gpu_count) == (None, None)

    setup["alice"].is_superuser = True
    setup["alice"].save(update_fields=["is_superuser"])
    for bad, field in (({"gpu_price_per_hour": "-1"}, "gpu_price_per_hour"), ({"gpu_count": 0}, "gpu_count"),
                       ({"gpu_price_per_hour": "1.23456"}, "gpu_price_per_hour")):
        answer = call(client, "put", path, setup["owner"], bad)
        assert answer.status_code == 400 and field in str(answer.json()), (bad, answer.content)
    host.refresh_from_db()
    assert (host.gpu_price_per_hour, host.gpu_count) == (None, None)
    assert not AuditEvent.objects.filter(action=AuditAction.SETTING_CHANGED).exists()

    answer = call(client, "put", path, setup["owner"], price)
    assert answer.status_code == 200, answer.content
    assert answer.json()["gpu_price_per_hour"] in ("1.25", "1.2500", 1.25) and answer.json()["gpu_count"] == 2
    host.refresh_from_db()
    assert (str(host.gpu_price_per_hour), host.gpu_count) == ("1.2500", 2)
    [event] = AuditEvent.objects.filter(action=AuditAction.SETTING_CHANGED)
    assert event.target == "GPU price of box" and "None → 1.25" in str(event.detail)
    cleared = call(client, "put", path, setup["owner"], {"gpu_price_per_hour": None, "gpu_count": None})
    assert cleared.status_code == 200 and cleared.json()["gpu_price_per_hour"] is None
    assert call(client, "put", "/hosts/999999/gpu-price", setup["owner"], price).status_code == 404

def test_a_quality_report_is_cancelled_on_the_page_and_by_api(client, setup):
    team = setup["team_a"]
    first = EvaluationJob.objects.create(team=team, model=setup["model"], queue="gpu")
    second = EvaluationJob.objects.create(team=team, model=setup["model"], queue="gpu")

    client.force_login(setup["vera"])
    assert client.post(reverse("evaluation_cancel", args=[first.pk])).status_code == 403
    page = client.get(reverse("evaluation_job", args=[first.pk])).content.decode()
    assert reverse("evaluation_cancel", args=[first.pk]) not in page  # a viewer is not offered the button
    client.force_login(setup["alice"])
    page = client.get(reverse("evaluation_job", args=[first.pk])).content.decode()
    assert reverse("evaluation_cancel", args=[first.pk]) in page
    client.post(reverse("evaluation_cancel", args=[first.pk]))
    first.refresh_from_db()
    assert first.state == "cancelled"

    assert call(client, "post", f"/quality-jobs/{second.pk}/cancel", setup["other"]).status_code == 404
    answer = call(client, "post", f"/quality-jobs/{second.pk}/cancel", setup["owner"])
    assert answer.status_code == 200 and answer.json()["state"] == "cancelled"
    assert AuditEvent.objects.filter(action=AuditAction.JOB_CANCELLED, target__startswith="quality report").count() == 2
