"""A team's GPU quota: its deployments hold at most that many GPUs at once (tensor × pipeline parallel × replicas
on GPU hosts, the GPUs given where known; a CPU host's deployments hold none). A launch past it is refused in words
with nothing written; another team is not affected; only an owner sets it, on the Members page."""
import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from panel.accounts.models import Team
from panel.audit.models import AuditAction, AuditEvent
from panel.jobs.models import JobEvent
from panel.serving.models import Deployment
from panel.serving.services import deployment_launch
from tests.support.channels import make_deployment
from tests.support.replicas import host, profile  # noqa: F401 (profile: a fixture)


def launch(team, user, profile, replicas=1, **options):
    return deployment_launch(team=team, user=user, profile=profile, replicas=replicas, enqueue=False, **options)


def quota(team, gpus):
    Team.objects.filter(pk=team.pk).update(gpu_quota=gpus)
    team.refresh_from_db()


def test_a_launch_past_the_teams_gpu_quota_is_refused_in_words_and_nothing_is_written(team_setup, profile):
    team, alice = team_setup["team_a"], team_setup["alice"]
    profile.tensor_parallel_size = 2
    profile.model.num_attention_heads, profile.model.num_kv_heads = 4, 2
    profile.model.save()
    profile.save()
    big = host("eight-gpus", gpus=8)
    quota(team, 4)
    running = make_deployment(team, alice, "other", state="ready", port=9001)
    Deployment.objects.filter(pk=running.pk).update(host=big, gpu_indices=[0])  # holds one GPU
    launch(team, alice, profile, host=big)  # 1 + 2 of 4
    rows, events = Deployment.objects.count(), JobEvent.objects.count()
    with pytest.raises(ValidationError) as refused:
        launch(team, alice, profile, host=big)  # 3 + 2 > 4: the host has room, the team has not
    assert refused.value.messages == [
        "This launch needs 2 GPUs, and your team's deployments already hold 3 of its quota of 4: stop a deployment "
        "or ask for fewer replicas, or ask an owner of the team to raise its GPU quota (Members page)."]
    assert (Deployment.objects.count(), JobEvent.objects.count()) == (rows, events)

    other = team_setup["team_b"]  # team A's deployments on the same host are not counted against team B
    quota(other, 1)
    theirs = make_deployment(other, team_setup["bob"], "theirs", served="theirs")
    Deployment.objects.filter(pk=theirs.pk).delete()
    theirs.profile.max_model_len, theirs.profile.block_size = 2048, 32
    theirs.profile.save()
    assert launch(other, team_setup["bob"], theirs.profile, host=big).host == big

def test_replicas_count_each_and_a_cpu_host_counts_none(team_setup, profile):
    team, alice = team_setup["team_a"], team_setup["alice"]
    gpu_host = host("four-gpus", gpus=4)
    quota(team, 2)
    with pytest.raises(ValidationError, match="needs 3 GPUs"):
        launch(team, alice, profile, replicas=3, host=gpu_host)
    assert not Deployment.objects.exists()
    launch(team, alice, profile, replicas=2, host=gpu_host)
    quota(team, 0)  # CPU hosts only
    cpu = host("cpu-only", memory_gib=16)
    assert launch(team, alice, profile, host=cpu).host == cpu
    quota(team, None)  # no limit
    assert launch(team, alice, profile, host=gpu_host).host == gpu_host


def test_only_an_owner_sets_the_quota_on_the_members_page(team_setup, client, django_user_model):
    from panel.accounts.models import Role
    from panel.accounts.services import membership_add
    from tests.support.teams import user_create

    team = team_setup["team_a"]
    admin = user_create("quota-admin", "pw-admin-123")
    membership_add(team=team, user=admin, role=Role.ADMIN)
    client.force_login(admin)
    page = client.get(reverse("members")).content.decode()
    assert "No limit: the team's deployments may hold any number of GPUs." in page and 'name="gpu_quota"' not in page
    assert client.post(reverse("team_gpu_quota"), {"gpu_quota": "100"}).status_code == 403
    team.refresh_from_db()
    assert team.gpu_quota is None

    client.force_login(team_setup["alice"])
    assert client.post(reverse("team_gpu_quota"), {"gpu_quota": "-1"}).status_code == 400
    saved = client.post(reverse("team_gpu_quota"), {"gpu_quota": "4"})
    assert saved.status_code == 302
    team.refresh_from_db()
    assert team.gpu_quota == 4
    assert AuditEvent.objects.filter(action=AuditAction.SETTING_CHANGED, target="the team's GPU quota").exists()
    assert 'name="gpu_quota"' in client.get(reverse("members")).content.decode()
    client.post(reverse("team_gpu_quota"), {"gpu_quota": ""})
    team.refresh_from_db()
    assert team.gpu_quota is None
