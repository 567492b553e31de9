"""The audit log: what is recorded, that it is append-only everywhere, filtering, CSV, and that it never holds a
password or a key."""
import pytest
from django.urls import reverse

from panel.audit.models import AuditAction, AuditEvent
from panel.channels.models import Route


def actions(without_signins=False):
    events = AuditEvent.objects.order_by("at", "id")
    if without_signins:  # force_login signs in too
        events = events.exclude(action=AuditAction.SIGNIN)
    return list(events.values_list("action", flat=True))


def test_it_records_sign_ins_and_failures_without_the_password(client, team_setup):
    client.post(reverse("login"), {"username": "alice", "password": "not-her-password"})
    client.post(reverse("login"), {"username": "alice", "password": "pw-alice-123"}, REMOTE_ADDR="10.1.2.3")
    assert actions() == [AuditAction.SIGNIN_FAILED, AuditAction.SIGNIN]
    failed, ok = AuditEvent.objects.order_by("at", "id")
    assert failed.actor == team_setup["alice"] and failed.target == "alice"
    assert ok.address == "10.1.2.3" and ok.actor_name == "alice"
    assert "not-her-password" not in repr(list(AuditEvent.objects.values()))


def test_it_records_key_issue_and_revoke_without_the_key(client, team_setup):
    Route.objects.create(team=team_setup["team_a"], model_name="chat")
    client.force_login(team_setup["alice"])
    page = client.post(reverse("key_create"), {"name": "bot"}).content.decode()
    raw = page.split('id="new-key">')[1].split("<")[0]
    from panel.accounts.models import TeamKey

    client.post(reverse("key_revoke", args=[TeamKey.objects.get().pk]))
    assert actions(without_signins=True) == [AuditAction.KEY_ISSUED, AuditAction.KEY_REVOKED]
    assert raw not in repr(list(AuditEvent.objects.values()))
    assert all(event.team == team_setup["team_a"] for event in AuditEvent.objects.exclude(action=AuditAction.SIGNIN))


def test_it_records_refused_authorization(client, team_setup):
    client.force_login(team_setup["vera"])
    assert client.post(reverse("key_create"), {"name": "x"}).status_code == 403
    event = AuditEvent.objects.get(action=AuditAction.REFUSED)
    assert (event.action, event.actor, event.target) == (AuditAction.REFUSED, team_setup["vera"], "/keys/new/")
    assert event.detail == {"needed": "member", "had": "viewer"}  # members issue their own keys where allowed


def test_it_cannot_be_edited_or_deleted(team_setup):
    event = AuditEvent.objects.create(action=AuditAction.SIGNIN, actor_name="x")
    event.target = "changed"
    with pytest.raises(PermissionError):
        event.save()
    with pytest.raises(PermissionError):
        event.delete()
    with pytest.raises(PermissionError):
        AuditEvent.objects.all().delete()
    with pytest.raises(PermissionError):
        AuditEvent.objects.filter(pk=event.pk).update(target="changed")
    from django.contrib import admin

    model_admin = admin.site._registry[AuditEvent]
    assert not model_admin.has_change_permission(None) and not model_admin.has_delete_permission(None)
    assert not model_admin.has_add_permission(None)


def test_it_filters_exports_and_shows_only_the_teams_events(client, team_setup):
    from panel.audit.services import audit_record

    audit_record(action=AuditAction.JOB_LAUNCHED, team=team_setup["team_a"], actor=team_setup["alice"], target="q #1")
    audit_record(action=AuditAction.DEPLOYMENT_STARTED, team=team_setup["team_a"], actor=team_setup["alice"],
                 target="tiny #2")
    audit_record(action=AuditAction.JOB_LAUNCHED, team=team_setup["team_b"], actor=team_setup["bob"], target="theirs")
    client.force_login(team_setup["alice"])
    page = client.get(reverse("audit"), {"action": "job_launched"}).content.decode()
    assert "q #1" in page and "tiny #2" not in page and "theirs" not in page
    csv_text = client.get(reverse("audit_csv")).content.decode()
    assert csv_text.startswith("at (UTC),actor,action,target,address,detail")
    assert "q #1" in csv_text and "tiny #2" in csv_text and "theirs" not in csv_text
    client.force_login(team_setup["vera"])
    assert client.get(reverse("audit")).status_code == 403


def test_the_page_shows_each_events_details_in_words(client, team_setup):
    from panel.audit.services import audit_record

    audit_record(action=AuditAction.CANARY_ROLLED_BACK, team=team_setup["team_a"], target="chat", percent_from=25,
                 reason="JSON parse failures 40.0% <b>" + "x" * 400, auto=True, groups=["ml", "ops"])
    audit_record(action=AuditAction.JOB_LAUNCHED, team=team_setup["team_a"], target="plain")
    audit_record(action=AuditAction.SETTING_CHANGED, team=team_setup["team_a"], target="many",
                 **{f"field_{n}": n for n in range(12)})
    client.force_login(team_setup["alice"])
    page = client.get(reverse("audit")).content.decode()
    assert '<span class="muted">percent from:</span> 25' in page
    assert "auto:</span> yes" in page and "groups:</span> ml, ops" in page
    assert "JSON parse failures 40.0% &lt;b&gt;" + "x" * 100 in page and "x" * 400 not in page  # escaped, cut
    assert "field 7:</span> 7" in page and "field 8:" not in page and "and 4 more in the CSV export" in page
    csv_text = client.get(reverse("audit_csv")).content.decode()
    assert "x" * 400 in csv_text and "field_11" in csv_text  # the export keeps every detail whole


def test_it_records_deployment_start_and_stop(client, team_setup):
    from django.utils import timezone

    from panel.hosts.models import WorkerHost
    from panel.registry.models import RegisteredModel
    from panel.serving.models import Deployment, ServingProfile

    model = RegisteredModel.objects.create(
        team=team_setup["team_a"], name="tiny", path="/models/tiny", architecture="Qwen2ForCausalLM",
        model_type="qwen2", parameter_count=5_000_000, linear_parameter_count=4_000_000, num_layers=4,
        num_attention_heads=4, num_kv_heads=2, hidden_size=256, head_dim=64, max_position_embeddings=4096,
        dtype="bfloat16", size_bytes=10_000_000)
    profile = ServingProfile.objects.create(team=team_setup["team_a"], name="p", model=model, max_model_len=2048,
                                            block_size=32)
    WorkerHost.objects.create(name="gpu@h", host="h", kind="gpu", queues=["gpu"], last_seen=timezone.now(),
                              memory_available_bytes=16 * 2**30)
    client.force_login(team_setup["alice"])
    client.post(reverse("deployment_create", args=[profile.pk]))
    deployment = Deployment.objects.get()
    client.post(reverse("deployment_stop", args=[deployment.pk]), {"confirmed": "1"})
    assert actions(without_signins=True) == [AuditAction.DEPLOYMENT_STARTED, AuditAction.DEPLOYMENT_STOPPED]
    assert AuditEvent.objects.get(action=AuditAction.DEPLOYMENT_STARTED).target == f"p #{deployment.pk} on h"
