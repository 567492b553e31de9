"""Attack tests: taking over what another user made, or outliving a revocation. A member's deployment does not
re-point an admin's local channel named like the member's profile, a relaunch does not take a running deployment's
channel, and a personal access token cannot issue a token."""
from panel.accounts.models import Role
from panel.accounts.services import membership_add
from panel.channels.models import Channel, ChannelKind, CredentialKind, Route, RouteStrategy
from panel.channels.services import route_save
from panel.serving.services import DeploymentHooks
from tests.support.channels import make_deployment, set_state


def test_a_members_profile_named_after_an_admins_local_channel_does_not_take_it(team_setup, django_user_model):
    team, alice = team_setup["team_a"], team_setup["alice"]
    # The admin's own local channel (a vLLM run by hand), on the team's route.
    admins = Channel.objects.create(team=team, name="local-llama", kind=ChannelKind.LOCAL, created_by=alice,
                                    base_url="http://10.0.0.5:8000/v1", model_id="llama-70b",
                                    credential_kind=CredentialKind.NONE)
    route = route_save(team=team, model_name="llama-70b", strategy=RouteStrategy.LOCAL_FIRST,
                       entries=[(admins, 0, 1)])
    mallory = django_user_model.objects.create_user("mallory", password="pw-mallory-123")
    membership_add(team=team, user=mallory, role=Role.MEMBER)
    deployment = make_deployment(team, mallory, "llama", served="mallorys-model", state="starting")
    DeploymentHooks(deployment).ready({"problems": []})

    admins.refresh_from_db()
    assert (admins.base_url, admins.model_id, admins.deployment_id) == ("http://10.0.0.5:8000/v1", "llama-70b", None)
    assert admins.credential_kind == CredentialKind.NONE and admins.enabled
    assert [entry.channel for entry in route.entries()] == [admins]
    mine = Channel.objects.get(team=team, deployment=deployment)
    assert mine.pk != admins.pk and mine.name == f"local-llama-{deployment.pk}"
    assert not Route.objects.get(pk=route.pk).routechannel_set.filter(channel=mine).exists()


def test_a_relaunch_beside_a_ready_deployment_gets_its_own_channel(team_setup):
    team, alice = team_setup["team_a"], team_setup["alice"]
    first = make_deployment(team, alice, "tiny", state="starting", port=8300)
    DeploymentHooks(first).ready({"problems": []})
    first_channel = Channel.objects.get(team=team, deployment=first)
    assert first_channel.name == "local-tiny"

    second = make_deployment(team, alice, "tiny", state="starting", port=8301)  # Launch again, #1 still Ready
    DeploymentHooks(second).ready({"problems": []})
    first_channel.refresh_from_db()
    assert first_channel.deployment_id == first.pk and first_channel.enabled
    assert first_channel.base_url == "http://127.0.0.1:8300/v1"
    second_channel = Channel.objects.get(team=team, deployment=second)
    assert second_channel.name == f"local-tiny-{second.pk}" and second_channel.base_url.endswith(":8301/v1")
    # Both serve the profile's route, the running one first.
    assert Route.objects.get(team=team).ordered_channels() == [first_channel, second_channel]

    # #1 stopping disables only its own channel; a third launch takes #1's ended channel and name back.
    set_state(first, "stopped")
    first.on_transition()
    assert not Channel.objects.get(pk=first_channel.pk).enabled
    assert Channel.objects.get(pk=second_channel.pk).enabled
    third = make_deployment(team, alice, "tiny", state="starting", port=8302)
    DeploymentHooks(third).ready({"problems": []})
    first_channel.refresh_from_db()
    assert first_channel.deployment_id == third.pk and first_channel.enabled
    assert Channel.objects.filter(team=team).count() == 2


def test_a_token_cannot_mint_a_token_that_outlives_its_revocation(client, team_setup):
    """A stolen token that could issue a token without expiry would keep its holder in after its revocation."""
    import json

    from panel.accounts.models import AccessToken
    from panel.audit.models import AuditAction, AuditEvent
    from tests.support.api_helpers import bearer, token_for

    alice, team = team_setup["alice"], team_setup["team_a"]
    stolen = token_for(alice, team)
    minted = client.post("/api/v1/tokens", json.dumps({"name": "backdoor"}), content_type="application/json",
                         **bearer(stolen))
    assert minted.status_code == 403 and "cannot issue tokens" in minted.json()["detail"]
    assert not AccessToken.objects.filter(name="backdoor").exists()
    refused = AuditEvent.objects.get(action=AuditAction.REFUSED, actor=alice)
    assert refused.detail == {"needed": "session", "had": "token"}
    # A body the schema refuses is refused the same way (before the body is read).
    assert client.post("/api/v1/tokens", "{}", content_type="application/json", **bearer(stolen)).status_code == 403
    # Signed in, the same call issues one (the reference page works with the session).
    client.force_login(alice)
    issued = client.post("/api/v1/tokens", json.dumps({"name": "script"}), content_type="application/json")
    assert issued.status_code == 201 and issued.json()["token"].startswith("twp-")
