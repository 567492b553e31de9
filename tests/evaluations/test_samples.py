"""A route's traffic samples in the panel: the route page's note (off, then on, in words), the samples page for admins
only, its settings validated whole (a bad pattern saves nothing), audited and sent to the gateway with the routing;
an evaluation set made of the samples (the answer the client got as the reference, JSON where JSON was asked and
given, what cannot be a case left out and counted), a new version of a set of the same name; deleting them all."""
import json

import pytest
from django.urls import reverse

from panel.audit.models import AuditEvent
from panel.channels.models import Route
from panel.channels.routing import routing_version
from panel.core import crypto
from panel.evaluations.checks import run_check
from panel.evaluations.from_samples import eval_set_from_samples
from panel.evaluations.models import EvalSet
from panel.usage.models import TrafficSample

pytestmark = pytest.mark.django_db


@pytest.fixture
def route(team_setup):
    return Route.objects.create(team=team_setup["team_a"], model_name="support-bot")


def sample(route, messages, answer, json_requested=False):
    payload = json.dumps({"messages": messages, "answer": answer, "json_requested": json_requested})
    return TrafficSample.objects.create(team=route.team, route=route, endpoint="chat", model=route.model_name,
                                        payload=crypto.encrypt(payload))


def ask(text):
    return [{"role": "system", "content": "You are the support desk."}, {"role": "user", "content": text}]


def test_the_route_page_says_whether_it_keeps_samples_and_an_admin_turns_them_on(client, team_setup, route,
                                                                                  django_capture_on_commit_callbacks):
    client.force_login(team_setup["alice"])
    page = client.get(reverse("route_detail", args=[route.pk])).content.decode()
    assert "Off: this route keeps none of its requests." in page and reverse("route_samples", args=[route.pk]) in page
    version = routing_version(team_setup["team_a"].pk)

    refused = client.post(reverse("route_samples_settings", args=[route.pk]), {
        "samples_per_day": 50, "sample_retention_days": 7, "sample_redactions": "CUST-\\d{6}\n(?<=@)\\w+"})
    assert refused.status_code == 400 and "line 2: the pattern looks ahead or behind" in refused.content.decode()
    route.refresh_from_db()
    assert route.samples_per_day == 0 and route.sample_redactions == ""  # nothing saved

    with django_capture_on_commit_callbacks(execute=True):
        saved = client.post(reverse("route_samples_settings", args=[route.pk]), {
            "samples_per_day": 50, "sample_retention_days": 7, "sample_redactions": " CUST-\\d{6} \n\n"})
    assert saved.status_code == 302
    route.refresh_from_db()
    assert (route.samples_per_day, route.sample_retention_days, route.sample_redactions) == (50, 7, "CUST-\\d{6}")
    assert routing_version(team_setup["team_a"].pk) > version  # the gateways learn of it with the routing
    event = AuditEvent.objects.get(action="route_sampling_changed")
    assert event.target == "support-bot" and event.detail == {"samples_per_day": 50, "retention_days": 7,
                                                              "redaction_patterns": 1}
    page = client.get(reverse("route_detail", args=[route.pk])).content.decode()
    assert ("On: this route keeps up to 50 of its answered requests a day" in page
            and "e-mail addresses, API keys and tokens, bearer tokens, long numbers (cards, phones, accounts) and "
                "whatever your team&#x27;s pattern matches are replaced by [redacted]" in page
            and "deleted after 7 days" in page)


def test_only_admins_see_or_change_samples(client, team_setup, route):
    sample(route, ask("Where is my order?"), "It ships today.")
    client.force_login(team_setup["vera"])  # a viewer
    assert client.get(reverse("route_samples", args=[route.pk])).status_code == 403
    page = client.get(reverse("route_detail", args=[route.pk])).content.decode()
    assert "1 kept now." in page and reverse("route_samples", args=[route.pk]) not in page
    for name in ("route_samples_settings", "route_samples_to_set", "route_samples_delete"):
        assert client.post(reverse(name, args=[route.pk]), {"samples_per_day": 5, "sample_retention_days": 5,
                                                            "name": "x"}).status_code == 403
    client.force_login(team_setup["bob"])  # another team's owner: not their route
    assert client.get(reverse("route_samples", args=[route.pk])).status_code == 404
    assert TrafficSample.objects.count() == 1 and not EvalSet.objects.exists()


def test_an_admin_reads_the_samples_makes_a_set_of_them_and_deletes_them(client, team_setup, route):
    sample(route, ask("Where is my order [redacted]?"), "Your order ships today.")
    sample(route, ask("Give the order as JSON."), '{"order": 7, "state": "shipped"}', json_requested=True)
    sample(route, ask("Say nothing."), "")  # no answer: cannot be a case
    sample(route, ask("x") + [{"role": "assistant", "content": "y"}], "z")  # ends with the assistant
    client.force_login(team_setup["alice"])
    page = client.get(reverse("route_samples", args=[route.pk])).content.decode()
    assert "Where is my order [redacted]?" in page and "Your order ships today." in page and "4 kept now." in page

    made = client.post(reverse("route_samples_to_set", args=[route.pk]), {"name": "support traffic"})
    eval_set = EvalSet.objects.get(name="support traffic")
    assert made.status_code == 302 and made.url == reverse("eval_set_detail", args=[eval_set.pk])
    cases = {case["messages"][-1]["content"]: case for case in eval_set.current().cases}
    assert set(cases) == {"Where is my order [redacted]?", "Give the order as JSON."}
    assert cases["Where is my order [redacted]?"]["checks"] == [
        {"type": "agrees", "answer": "Your order ships today.", "min_similarity": 0.5}]
    json_case = cases["Give the order as JSON."]
    assert [check["type"] for check in json_case["checks"]] == ["json", "agrees"]
    assert all(run_check(check, '{"order": 7, "state": "shipped"}').passed for check in json_case["checks"])
    shown = client.get(made.url)
    messages = [str(message) for message in shown.context["messages"]]
    assert len(messages) == 1 and messages[0].startswith("support traffic: 2 cases from the samples (")
    assert "1 left out: no answer text" in messages[0]
    assert "1 left out: the conversation does not end with a user message" in messages[0]

    sample(route, ask("Can I return it?"), "Yes, within 30 days.")
    again, cases_count, _ = eval_set_from_samples(route=route, user=team_setup["alice"], name="support traffic")
    assert again.pk == eval_set.pk and eval_set.current().number == 2 and cases_count == 3
    assert "traffic samples" in eval_set.current().note

    deleted = client.post(reverse("route_samples_delete", args=[route.pk]))
    assert deleted.status_code == 302 and not TrafficSample.objects.exists()
    assert AuditEvent.objects.get(action="samples_deleted").detail == {"deleted": 5}
    assert eval_set.current().cases  # the set keeps its cases


def test_a_set_from_no_usable_sample_is_refused_and_nothing_is_saved(client, team_setup, route):
    sample(route, ask("Say nothing."), "")
    client.force_login(team_setup["alice"])
    refused = client.post(reverse("route_samples_to_set", args=[route.pk]), {"name": "empty"})
    assert refused.status_code == 400 and not EvalSet.objects.exists()
