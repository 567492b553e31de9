"""Attack tests on who may do what: a member and an admin's serving profile and route, the evidence of a canary and
the autopilot, a removed member's keys, sets made of real traffic, and the API's reference."""
import pytest

from panel.accounts.models import Role
from panel.accounts.services import membership_add
from panel.channels.local_channels import local_channel_sync
from panel.channels.models import Route, RouteChannel
from panel.serving.models import ServingProfile
from tests.support.api_helpers import call, token_for
from tests.support.channels import make_deployment, set_state
from tests.support.gateway import fallback, gateway, primary, setup  # noqa: F401 (fixtures)
from tests.support.teams import user_create


@pytest.fixture
def mallory(team_setup):
    """A member of team A."""
    user = user_create("mallory", "pw-mallory-123")
    membership_add(team=team_setup["team_a"], user=user, role=Role.MEMBER)
    return user


def admins_profile_on_its_route(team_setup):
    """Alice's profile, served once (ended now): its local channel on the route it made, `tiny-served`."""
    team, alice = team_setup["team_a"], team_setup["alice"]
    first = make_deployment(team, alice, "admins", state="ready")
    ServingProfile.objects.filter(pk=first.profile_id).update(created_by=alice)
    channel = local_channel_sync(first)
    set_state(first, "stopped")
    local_channel_sync(first)
    route = Route.objects.get(team=team, model_name="tiny-served")
    assert RouteChannel.objects.filter(route=route, channel=channel).exists()
    return first.profile, route, channel


def test_a_member_cannot_change_an_admins_profile_on_the_page(client, team_setup, mallory):
    profile, _, _ = admins_profile_on_its_route(team_setup)
    client.force_login(mallory)
    assert client.get(f"/serving/profiles/{profile.pk}/edit/").status_code == 403
    response = client.post(f"/serving/profiles/{profile.pk}/edit/",
                           {"name": profile.name, "model": profile.model_id, "extra_args": "--trust-remote-code"})
    assert response.status_code == 403
    profile.refresh_from_db()
    assert profile.extra_args == ""


def test_a_member_cannot_change_an_admins_profile_through_the_api(client, team_setup, mallory):
    profile, _, _ = admins_profile_on_its_route(team_setup)
    raw = token_for(mallory, team_setup["team_a"])
    response = call(client, "patch", f"/profiles/{profile.pk}", raw,
                    {"served_model_name": "mine", "extra_args": "--trust-remote-code"})
    assert response.status_code == 403, response.content
    assert "created" in response.json()["detail"]
    profile.refresh_from_db()
    assert (profile.served_model_name, profile.extra_args) == ("", "")


def test_a_member_cannot_launch_an_admins_profile(client, team_setup, mallory):
    profile, _, _ = admins_profile_on_its_route(team_setup)
    client.force_login(mallory)
    assert client.post(f"/serving/profiles/{profile.pk}/launch/", {"another": "on"}).status_code == 403
    raw = token_for(mallory, team_setup["team_a"])
    assert call(client, "post", f"/profiles/{profile.pk}/deployments", raw, {"another": True}).status_code == 403
    assert profile.deployments.count() == 1


def test_a_members_relaunch_stays_off_an_admins_route(team_setup, mallory):
    """Even a deployment a member got going some other way (a profile they made that an admin had attached, then
    changed): its channel, taken over from the admin's run, leaves the admin's route instead of taking its traffic."""
    profile, route, channel = admins_profile_on_its_route(team_setup)
    relaunch = make_deployment(team_setup["team_a"], mallory, profile.name, state="ready", port=8124)
    mine = local_channel_sync(relaunch)
    assert mine.enabled
    assert not RouteChannel.objects.filter(route=route, channel=mine).exists()
    assert not RouteChannel.objects.filter(route=route, channel__enabled=True).exists()


def test_an_admins_relaunch_keeps_its_route(team_setup):
    profile, route, channel = admins_profile_on_its_route(team_setup)
    relaunch = make_deployment(team_setup["team_a"], team_setup["alice"], profile.name, state="ready", port=8124)
    assert local_channel_sync(relaunch).pk == channel.pk
    assert RouteChannel.objects.filter(route=route, channel=channel).exists()


def test_a_member_still_changes_and_launches_their_own_profile(client, team_setup, mallory):
    deployment = make_deployment(team_setup["team_a"], mallory, "mine", served="mine")
    ServingProfile.objects.filter(pk=deployment.profile_id).update(created_by=mallory)
    raw = token_for(mallory, team_setup["team_a"])
    response = call(client, "patch", f"/profiles/{deployment.profile_id}", raw, {"max_model_len": 1024})
    assert response.status_code == 200, response.content
    assert ServingProfile.objects.get(pk=deployment.profile_id).max_model_len == 1024


def test_a_profile_of_unknown_creator_is_the_admins(client, team_setup, mallory):
    deployment = make_deployment(team_setup["team_a"], None, "old")
    raw = token_for(mallory, team_setup["team_a"])
    path, body = f"/profiles/{deployment.profile_id}", {"max_model_len": 1024}
    assert call(client, "patch", path, raw, body).status_code == 403
    assert call(client, "patch", path, token_for(team_setup["alice"], team_setup["team_a"]), body).status_code == 200


def test_a_removed_members_own_key_stops_answering(gateway, setup, mallory):
    """A member issues a key for themself; an admin removes the member: the key is revoked with the removal, and the
    gateway refuses it within TOKENWISE_KEY_CACHE_SECONDS (here at once after it was last read)."""
    from django.conf import settings

    from panel.accounts.keys import key_issue_as
    from panel.accounts.models import AccessToken, Membership
    from panel.accounts.services import member_remove
    from panel.audit.models import AuditAction, AuditEvent
    from tests.support.gateway import CHAT, post
    from tests.support.waiting import wait_until

    team = setup["team"]
    team.member_keys = True
    team.save()
    membership = Membership.objects.get(team=team, user=mallory)
    key, raw = key_issue_as(membership=membership, user=mallory, name="laptop")
    token_for(mallory, team)
    assert post(gateway, raw, CHAT).status_code == 200
    owner = Membership.objects.get(team=team, user=setup["alice"])
    member_remove(actor=owner, membership=membership)
    wait_until(lambda: post(gateway, raw, CHAT).status_code == 401, seconds=settings.KEY_CACHE_SECONDS + 3,
               message="the removed member's key refused")
    key.refresh_from_db()
    setup["key"].refresh_from_db()
    assert key.revoked_at is not None and setup["key"].revoked_at is None
    assert not AccessToken.objects.filter(user=mallory, revoked_at__isnull=True).exists()
    assert AuditEvent.objects.filter(action=AuditAction.KEY_REVOKED, detail__keys=1).exists()
    assert post(gateway, setup["raw"], CHAT).status_code == 200  # the team's other keys still answer


def test_a_set_made_of_traffic_samples_is_for_admins_only(client, team_setup, mallory):
    """Its cases are the team's users' real prompts and answers: a viewer or member finds neither the set, its
    JSONL, nor its runs, on the pages or through the API; an admin reads it as before."""
    import json

    from panel.channels.models import Route
    from panel.core import crypto
    from panel.evaluations.from_samples import eval_set_from_samples
    from panel.evaluations.models import EvalRun
    from panel.usage.models import TrafficSample

    team = team_setup["team_a"]
    route = Route.objects.create(team=team, model_name="support-bot")
    payload = {"messages": [{"role": "user", "content": "my card 4111 was charged twice"}], "answer": "Refunded."}
    TrafficSample.objects.create(team=team, route=route, endpoint="chat", model=route.model_name,
                                 payload=crypto.encrypt(json.dumps(payload)))
    eval_set, _, _ = eval_set_from_samples(route=route, user=team_setup["alice"], name="support traffic")
    run = EvalRun.objects.create(team=team, eval_version=eval_set.current(), candidate={"kind": "route"})
    for user in (team_setup["vera"], mallory):
        client.force_login(user)
        assert "4111" not in client.get("/evaluations/").content.decode()
        for path in (f"/evaluations/{eval_set.pk}/", f"/evaluations/{eval_set.pk}/versions/1.jsonl",
                     f"/evaluations/runs/{run.pk}/"):
            response = client.get(path)
            assert response.status_code == 404 and "4111" not in response.content.decode(), path
        raw = token_for(user, team)
        assert call(client, "get", f"/eval-sets/{eval_set.pk}", raw).status_code == 404
        assert call(client, "get", f"/eval-sets/{eval_set.pk}/versions/1/jsonl", raw).status_code == 404
        assert "support traffic" not in call(client, "get", "/eval-sets", raw).content.decode()
    client.force_login(team_setup["alice"])
    assert "4111" in client.get(f"/evaluations/{eval_set.pk}/versions/1.jsonl").content.decode()


def test_the_api_schema_and_reference_are_for_signed_in_members_and_tokens(client, team_setup):
    anonymous = client.get("/api/v1/openapi.json")
    assert anonymous.status_code == 401 and "paths" not in anonymous.content.decode()
    assert "Authorization: Bearer" in anonymous.json()["detail"]
    page = client.get("/api/v1/docs")
    assert page.status_code == 302 and page["Location"].startswith("/login/")
    assert client.get("/api/v1/openapi.json", HTTP_AUTHORIZATION="Bearer twp-not-a-token").status_code == 401
    raw = token_for(team_setup["vera"], team_setup["team_a"])
    assert "paths" in call(client, "get", "/openapi.json", raw).json()
    client.force_login(team_setup["vera"])
    assert client.get("/api/v1/docs").status_code == 200
    assert "paths" in client.get("/api/v1/openapi.json").json()
