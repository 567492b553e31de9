"""Error pages in the panel's own layout (403, 404, 500), JSON on /api/ paths, and a sidebar that shows a role only
the sections it may open (a member saw Audit and reached a bare 403)."""
import pytest
from django.test import Client
from django.urls import reverse

from panel.accounts.models import Membership, Role


@pytest.fixture
def member(team_setup):
    user = team_setup["vera"]
    Membership.objects.filter(user=user, team=team_setup["team_a"]).update(role=Role.MEMBER)
    return user


def test_a_member_sees_no_audit_in_the_sidebar_and_a_styled_403_there(client, team_setup, member):
    client.force_login(member)
    home = client.get(reverse("home")).content.decode()
    assert f'href="{reverse("audit")}"' not in home and f'href="{reverse("models")}"' in home
    refused = client.get(reverse("audit"))
    page = refused.content.decode()
    assert refused.status_code == 403 and "<h1>Not allowed</h1>" in page and 'class="sidebar"' in page
    assert "This needs the admin role in Team A." in page
    client.force_login(team_setup["alice"])  # the owner sees it
    assert f'href="{reverse("audit")}"' in client.get(reverse("home")).content.decode()


def test_an_unknown_page_is_a_styled_404_and_an_unknown_api_path_is_json(client, team_setup):
    client.force_login(team_setup["alice"])
    missing = client.get("/no-such-page/")
    assert missing.status_code == 404 and "<h1>Not found</h1>" in missing.content.decode()
    assert 'class="sidebar"' in missing.content.decode()
    api = client.get("/api/v1/no-such-thing")
    assert api.status_code == 404 and api["Content-Type"].startswith("application/json")
    assert "/api/v1/no-such-thing" in api.json()["detail"]
    anonymous = Client().get("/no-such-page/")
    assert anonymous.status_code == 404 and "Sign in" in anonymous.content.decode()


def test_a_server_error_is_a_page_in_words(rf):
    from panel.views import server_error

    response = server_error(rf.get("/models/"))
    assert response.status_code == 500 and "Something went wrong" in response.content.decode()
    api = server_error(rf.get("/api/v1/models"))
    assert api.status_code == 500 and api["Content-Type"].startswith("application/json")
