"""Evaluation sets: the JSONL read whole (every problem named with its line, nothing saved), versions that never
change, the starter set, and the same through the pages and the API (with the roles that may)."""
import json

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from panel.audit.models import AuditAction, AuditEvent
from panel.evaluations.models import EvalSet, EvalSetVersion
from panel.evaluations.services import eval_set_create, eval_set_revise, starter_set_add
from panel.evaluations.sets import MAX_CASES, SetProblems, cases_jsonl, parse_cases
from panel.evaluations.starter import CASES
from tests.support.api_helpers import call, owner_token, token_for  # noqa: F401 (owner_token: a fixture)

GOOD = "\n".join([
    json.dumps({"id": "total", "prompt": "Total of 2 and 3 as JSON.", "system": "JSON only.",
                "checks": [{"type": "json"}, {"type": "contains", "text": "5"}], "max_tokens": 64}),
    "",
    json.dumps({"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"},
                             {"role": "user", "content": "Again"}],
                "checks": [{"type": "regex", "pattern": "^hi", "flags": "i"}]}),
])


def test_it_reads_cases_and_writes_them_back_the_same():
    cases = parse_cases(GOOD)
    assert [case["id"] for case in cases] == ["total", "case-3"]  # the id of a case without one: its line
    assert cases[0]["messages"] == [{"role": "system", "content": "JSON only."},
                                    {"role": "user", "content": "Total of 2 and 3 as JSON."}]
    assert (cases[0]["max_tokens"], cases[1]["max_tokens"]) == (64, 256)
    assert parse_cases(cases_jsonl(cases)) == cases


@pytest.mark.parametrize("line, words", [
    ("not json", "line 1: not JSON"),
    ("[1, 2]", "line 1: a case is a JSON object"),
    ('{"prompt": "x"}', "line 1: checks must be a list of at least one check"),
    ('{"prompt": "x", "checks": []}', "line 1: checks must be a list of at least one check"),
    ('{"checks": [{"type": "json"}]}', "line 1: give either prompt (a user message) or messages"),
    ('{"prompt": "x", "messages": [], "checks": [{"type": "json"}]}', "give either prompt"),
    ('{"prompt": "x", "checks": [{"type": "json"}], "colour": 1}', "unknown field 'colour'"),
    ('{"prompt": "", "checks": [{"type": "json"}]}', "message 1: content must be a non-empty text"),
    ('{"prompt": "x", "checks": [{"type": "json"}], "max_tokens": 0}', "max_tokens must be a whole number"),
    ('{"prompt": "x", "checks": [{"type": "json"}], "max_tokens": true}', "max_tokens must be a whole number"),
    ('{"prompt": "x", "checks": [{"type": "nope"}]}', "line 1: check 1:"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], '
     '"checks": [{"type": "json"}]}', "the last message must be the user's"),
    ('{"messages": [{"role": "robot", "content": "a"}], "checks": [{"type": "json"}]}', "role must be one of"),
    ('{"id": "", "prompt": "x", "checks": [{"type": "json"}]}', "id must be a non-empty text"),
])
def test_every_problem_is_named_with_its_line(line, words):
    with pytest.raises(SetProblems) as raised:
        parse_cases(line)
    assert words in str(raised.value), raised.value.problems


def test_it_names_every_bad_line_and_a_repeated_id():
    text = "\n".join([json.dumps({"id": "a", "prompt": "x", "checks": [{"type": "json"}]}), "oops",
                      json.dumps({"id": "a", "prompt": "y", "checks": [{"type": "json"}]})])
    with pytest.raises(SetProblems) as raised:
        parse_cases(text)
    assert [problem.split(":")[0] for problem in raised.value.problems] == ["line 2", "line 3"]
    assert "the id 'a' is used by an earlier case" in raised.value.problems[1]


def test_bounds_empty_too_many_and_not_utf8():
    with pytest.raises(SetProblems, match="the set has no cases"):
        parse_cases("\n  \n")
    line = json.dumps({"prompt": "x", "checks": [{"type": "json"}]})
    with pytest.raises(SetProblems, match=f"at most {MAX_CASES} cases"):
        parse_cases("\n".join([line] * (MAX_CASES + 1)))
    with pytest.raises(SetProblems, match="not UTF-8"):
        parse_cases(b"\xff\xfe")


def test_a_bad_jsonl_saves_nothing_and_a_new_version_keeps_the_old(team_setup):
    team, alice = team_setup["team_a"], team_setup["alice"]
    with pytest.raises(ValidationError) as raised:
        eval_set_create(team=team, user=alice, name="", text="oops")
    assert set(raised.value.message_dict) == {"name", "cases"}
    assert not EvalSet.objects.exists() and not EvalSetVersion.objects.exists()

    eval_set = eval_set_create(team=team, user=alice, name="support", text=GOOD)
    with pytest.raises(ValidationError, match="already has a set named"):
        eval_set_create(team=team, user=alice, name="support", text=GOOD)
    first = eval_set.current()
    with pytest.raises(ValidationError):
        eval_set_revise(eval_set=eval_set, user=alice, text=GOOD + "\nbroken")
    assert eval_set.versions.count() == 1
    assert eval_set_revise(eval_set=eval_set, user=alice, text=GOOD).number == 1  # the same cases: no new version
    second = eval_set_revise(eval_set=eval_set, user=alice, text=GOOD.split("\n")[0], note="dropped the chat")
    assert (second.number, len(second.cases), second.note) == (2, 1, "dropped the chat")
    first.refresh_from_db()
    assert len(first.cases) == 2  # the old version is as it was
    assert AuditEvent.objects.filter(action=AuditAction.EVAL_SET_SAVED).count() == 2


def test_the_starter_set_reads_and_can_be_added_twice(team_setup):
    team, alice = team_setup["team_a"], team_setup["alice"]
    first = starter_set_add(team=team, user=alice)
    second = starter_set_add(team=team, user=alice)
    assert len(first.current().cases) == len(CASES) == 12
    assert second.name == f"{first.name} (2)"
    kinds = {check["type"] for case in first.current().cases for check in case["checks"]}
    assert kinds == {"json", "json_schema", "regex", "contains", "exact"}


def test_the_pages_create_show_revise_and_download(client, team_setup):
    client.force_login(team_setup["alice"])
    bad = client.post(reverse("eval_set_new"), {"name": "support", "cases": "oops"})
    assert bad.status_code == 400 and "line 1: not JSON" in bad.content.decode()
    assert not EvalSet.objects.exists()
    made = client.post(reverse("eval_set_new"), {"name": "support", "description": "Tickets", "cases": GOOD})
    eval_set = EvalSet.objects.get()
    assert made.status_code == 302 and made.url == reverse("eval_set_detail", args=[eval_set.pk])
    page = client.get(made.url).content.decode()
    assert "Version 1 · 2 cases" in page and "valid JSON" in page and "Total of 2 and 3 as JSON." in page
    revised = client.post(reverse("eval_set_revise", args=[eval_set.pk]), {"cases": GOOD.split("\n")[0],
                                                                           "note": "one case"})
    assert revised.status_code == 302 and eval_set.current().number == 2
    refused = client.post(reverse("eval_set_revise", args=[eval_set.pk]), {"cases": "{}"})
    assert refused.status_code == 400 and eval_set.current().number == 2
    download = client.get(reverse("eval_set_download", args=[eval_set.pk, 1]))
    assert download["Content-Disposition"].endswith('-v1.jsonl"')
    assert parse_cases(download.content) == EvalSetVersion.objects.get(eval_set=eval_set, number=1).cases
    listing = client.get(reverse("evaluations")).content.decode()
    assert "support" in listing and "v2" in listing


def test_a_viewer_reads_and_cannot_change(client, team_setup):
    eval_set = eval_set_create(team=team_setup["team_a"], user=team_setup["alice"], name="support", text=GOOD)
    client.force_login(team_setup["vera"])
    page = client.get(reverse("eval_set_detail", args=[eval_set.pk])).content.decode()
    assert "Save version 2" not in page and "Delete set" not in page
    assert client.post(reverse("eval_set_revise", args=[eval_set.pk]), {"cases": GOOD}).status_code == 403
    assert client.post(reverse("eval_set_starter")).status_code == 403
    client.force_login(team_setup["bob"])  # another team's set is not found
    assert client.get(reverse("eval_set_detail", args=[eval_set.pk])).status_code == 404


def test_the_api_creates_revises_reads_and_deletes(client, team_setup, owner_token):
    bad = call(client, "post", "/eval-sets", owner_token, {"name": "support", "jsonl": "oops\n{}"})
    assert bad.status_code == 400 and len(bad.json()["errors"]["cases"]) == 3 and not EvalSet.objects.exists()
    made = call(client, "post", "/eval-sets", owner_token, {"name": "support", "jsonl": GOOD})
    assert made.status_code == 201 and made.json()["version"] == 1 and len(made.json()["cases"]) == 2
    set_id = made.json()["id"]
    revised = call(client, "post", f"/eval-sets/{set_id}/versions", owner_token,
                   {"jsonl": GOOD.split("\n")[0], "note": "one case"})
    assert revised.json()["version"] == 2 and [v["number"] for v in revised.json()["versions"]] == [2, 1]
    jsonl = call(client, "get", f"/eval-sets/{set_id}/versions/1/jsonl", owner_token)
    assert jsonl.status_code == 200 and len(parse_cases(jsonl.content)) == 2
    starter = call(client, "post", "/eval-sets/starter", owner_token)
    assert starter.status_code == 201 and len(starter.json()["cases"]) == 12
    assert len(call(client, "get", "/eval-sets", owner_token).json()) == 2
    assert call(client, "delete", f"/eval-sets/{set_id}", owner_token).status_code == 204
    assert not EvalSetVersion.objects.filter(eval_set_id=set_id).exists()
