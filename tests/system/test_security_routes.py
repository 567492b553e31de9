"""Attack test: a member's deployment whose served name is the team's existing route does not take that route's
traffic; only an admin's explicit choice at launch attaches it."""
from panel.accounts.models import Role
from panel.accounts.services import membership_add
from panel.channels.local_channels import local_channel_sync
from panel.channels.models import Route, RouteStrategy
from panel.channels.services import route_save
from panel.serving.models import Deployment
from tests.support.channels import make_deployment, remote


def test_a_deployment_named_like_an_existing_route_does_not_join_it(team_setup):
    team, alice = team_setup["team_a"], team_setup["alice"]
    cloud = remote(team, name="openai")
    route = route_save(team=team, model_name="gpt-4o", strategy=RouteStrategy.LOCAL_FIRST, entries=[(cloud, 0, 1)])
    deployment = make_deployment(team, alice, "mine", served="gpt-4o", state="ready")
    channel = local_channel_sync(deployment)
    assert channel.enabled and [entry.channel for entry in route.entries()] == [cloud]
    assert route.ordered_channels() == [cloud]  # local_first would have put the member's engine first


def test_only_an_admin_may_attach_at_launch(client, team_setup, django_user_model):
    team = team_setup["team_a"]
    member = django_user_model.objects.create_user("mallory", password="pw-mallory-123")
    membership_add(team=team, user=member, role=Role.MEMBER)
    deployment = make_deployment(team, member, "mine", served="gpt-4o")  # for its profile
    client.force_login(member)
    page = client.post(f"/serving/profiles/{deployment.profile_id}/launch/",
                       {"attach_to_route": "on", "another": "on"}, follow=True)  # beside its pending deployment
    assert "Only an admin may attach" in page.content.decode()
    assert Deployment.objects.count() == 1 and not Route.objects.exists()
