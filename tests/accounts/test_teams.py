"""Sign-in, the team switcher, and team scoping: another team's object is a 404, viewers cannot write."""
import pytest
from django.urls import reverse

from panel.hosts.models import EngineCheck, WorkerHost


@pytest.fixture
def gpu_host(db):
    from django.utils import timezone

    return WorkerHost.objects.create(name="gpu@h1", host="h1", kind="gpu", queues=["gpu", "gpu.h1"],
                                     last_seen=timezone.now())


def test_it_sends_anonymous_users_to_sign_in(client, db):
    for name in ["home", "hosts", "models", "compare"]:
        response = client.get(reverse(name))
        assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_it_signs_in_and_shows_the_navigation(client, team_setup):
    response = client.post(reverse("login"), {"username": "alice", "password": "pw-alice-123"})
    assert response.status_code == 302
    page = client.get(reverse("home")).content.decode()
    for title in ["Models", "Quantization", "Serving", "Channels", "Gateway keys", "Dashboards", "Compare",
                  "Benchmarks", "Audit", "Workers"]:
        assert f"<span class=\"label\">{title}</span>" in page
    assert "Team A" in page


def test_it_refuses_a_wrong_password(client, team_setup):
    response = client.post(reverse("login"), {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_it_switches_team_only_to_the_users_teams(client, team_setup):
    from panel.accounts.models import Role
    from panel.accounts.services import membership_add

    membership_add(team=team_setup["team_b"], user=team_setup["alice"], role=Role.MEMBER)
    client.force_login(team_setup["alice"])
    response = client.post(reverse("switch_team"), {"team": team_setup["team_b"].pk, "next": "/workers/"})
    assert response.status_code == 302 and response["Location"] == "/workers/"
    assert "Team B" in client.get(reverse("home")).content.decode().split("<h1>")[1]

    client.force_login(team_setup["vera"])
    response = client.post(reverse("switch_team"), {"team": team_setup["team_b"].pk})
    assert response.status_code == 404
    response = client.post(reverse("switch_team"), {"team": "x"})
    assert response.status_code == 404


def test_it_does_not_follow_an_offsite_next(client, team_setup):
    client.force_login(team_setup["alice"])
    response = client.post(reverse("switch_team"), {"team": team_setup["team_a"].pk, "next": "https://evil.example"})
    assert response["Location"] == reverse("home")


def test_it_hides_another_teams_job(client, team_setup, gpu_host):
    check = EngineCheck.objects.create(team=team_setup["team_b"], host=gpu_host)
    client.force_login(team_setup["alice"])
    assert client.get(reverse("engine_check", args=[check.pk])).status_code == 404
    assert client.get(reverse("engine_check_live", args=[check.pk])).status_code == 404
    client.force_login(team_setup["bob"])
    assert client.get(reverse("engine_check", args=[check.pk])).status_code == 200


def test_it_keeps_viewers_out_of_write_views(client, team_setup, gpu_host, monkeypatch):
    launched = []
    monkeypatch.setattr("panel.hosts.views.engine_check_launch", lambda **kw: launched.append(kw))
    client.force_login(team_setup["vera"])
    response = client.post(reverse("engine_check_create", args=[gpu_host.pk]))
    assert response.status_code == 403
    assert launched == []
    assert EngineCheck.objects.count() == 0
    assert client.get(reverse("hosts")).status_code == 200  # but may read


def test_it_launches_a_check_for_a_member(client, team_setup, gpu_host, django_capture_on_commit_callbacks):
    client.force_login(team_setup["alice"])
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post(reverse("engine_check_create", args=[gpu_host.pk]))
    check = EngineCheck.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("engine_check", args=[check.pk])
    assert (check.team, check.created_by, check.queue) == (team_setup["team_a"], team_setup["alice"], "gpu.h1")


def test_it_refuses_a_check_on_an_offline_host(client, team_setup, gpu_host):
    WorkerHost.objects.filter(pk=gpu_host.pk).update(last_seen=None)
    client.force_login(team_setup["alice"])
    response = client.post(reverse("engine_check_create", args=[gpu_host.pk]), follow=True)
    assert "is offline" in response.content.decode()
    assert EngineCheck.objects.count() == 0


def test_it_sends_a_user_without_a_team_to_an_explanation(client, db, django_user_model):
    user = django_user_model.objects.create_user("loner", password="pw-loner-123")
    client.force_login(user)
    response = client.get(reverse("home"), follow=True)
    assert "You are not in a team yet" in response.content.decode()


def test_it_links_every_section_of_the_navigation_to_its_own_page(client, team_setup):
    from panel.core.sections import SECTIONS

    client.force_login(team_setup["alice"])
    home = client.get(reverse("home")).content.decode()
    for section in SECTIONS:
        url = reverse(section.slug)
        assert f'href="{url}"' in home, section.slug
        response = client.get(url)
        assert response.status_code == 200, (section.slug, response.status_code)
        assert section.title.split()[0] in response.content.decode(), section.slug
