"""The quality report's task set (engine/quality_tasks.py): prompts that say what they want, and answers scored as
a user would read them."""
import json

import pytest

from engine import quality_tasks
from engine.quality_tasks import is_right, json_object_in, score, tasks


def test_the_set_asks_for_what_it_checks():
    items = tasks()
    assert [item["kind"] for item in items].count("json") == quality_tasks.JSON_TASKS == 12
    assert {item["kind"] for item in items} == set(quality_tasks.KINDS) and len(items) == 30
    for item in items:
        assert [message["role"] for message in item["messages"]] == ["user"]
    for item in (item for item in items if item["kind"] == "json"):
        question = item["messages"][0]["content"]
        assert all(f'"{key}"' in question for key in item["expected"])  # every key named
        assert f'name "{item["expected"]["name"]}"' in question and str(item["expected"]["id"]) in question


def json_task():
    return tasks()[0]


@pytest.mark.parametrize("answer, right", [
    ('{"name": "anchor", "id": 503, "active": true}', True),
    ('```json\n{"name": "anchor", "id": 503, "active": true}\n```', True),
    ('Here it is: {"name": "anchor", "id": 503, "active": true} Hope that helps.', True),
    ('{"name": "Anchor", "id": 503, "active": true}', True),  # a name capitalised, as real models write names
    ('{"name": "meadow", "id": 399, "active": false}', True),  # the keys and types a parser relies on
    ('{"name": "anchor", "id": "503", "active": true}', False),  # a string where a number was asked for
    ('{"name": "anchor", "id": 503, "active": "yes"}', False),
    ('{"name": "anchor", "id": 503}', False),
    ('{"name": "anchor", "id": 503, "active": true, "extra": 1}', False),
    ('{"name": "anchor", "id": 503, "active": tru', False),  # cut off
    ("The record is anchor, 503, true.", False),
])
def test_a_json_answer_counts_when_it_holds_the_keys_and_types_asked_for(answer, right):
    task = json_task()
    assert task["expected"] == {"name": "anchor", "id": 503, "active": True}
    assert is_right(task, answer) is right


def test_word_copy_and_classify_answers():
    by_kind = {}
    for item in tasks():
        by_kind.setdefault(item["kind"], []).append(item)
    japan, week = by_kind["word"][0], by_kind["word"][7]
    assert is_right(japan, "Tokyo.") and is_right(japan, "The capital of Japan is Tokyo.")
    assert not is_right(japan, "Kyoto") and is_right(week, "7") and is_right(week, "There are seven days.")
    fox = by_kind["copy"][0]
    assert fox["messages"][0]["content"] == 'Repeat after me: "the quick brown fox"'
    assert is_right(fox, "the quick brown fox") and is_right(fox, "The quick brown fox is a classic example.")
    assert not is_right(fox, "the quick fox") and not is_right(fox, "I'm sorry, I cannot repeat that.")
    apple, snow = by_kind["classify"][:2]
    assert is_right(apple, "A fruit.") and is_right(apple, "An apple is a fruit, not a vegetable.")
    assert not is_right(apple, "A vegetable, not a fruit.") and not is_right(apple, "Neither.")
    assert is_right(snow, 'The answer is "cold."') and not is_right(snow, "hot")


def test_a_score_counts_each_kind():
    items = tasks()
    answers = [json.dumps(item["expected"]) if item["kind"] == "json" else "no idea" for item in items]
    scored = score(items, answers)
    assert scored["kinds"] == {"json": [12, 12], "word": [0, 10], "copy": [0, 4], "classify": [0, 4]}
    assert scored["right"][:12] == [True] * 12 and len(scored["answers"]) == 30
    assert json_object_in("no object here") is None and json_object_in("[1, 2]") is None
