"""Tags on a gateway request: from the x-tokenwise-tags header and the body's metadata.tags (a list or one string),
recorded on the usage row, taken out of the body before any upstream sees it (the rest of metadata kept), in the
OpenAI and the Anthropic APIs; a bad tag is refused with the reason and nothing goes upstream."""
import anthropic
import httpx
import openai
import pytest

from tests.support.fake_messages_upstream import FakeMessagesUpstream
from tests.support.gateway import (  # noqa: F401 (fixtures)
    CHAT,
    channel,
    fallback,
    gateway,
    primary,
    records,
    route_to,
    setup,
)


def test_tags_from_the_header_and_metadata_are_recorded_and_never_sent_upstream(gateway, setup, primary):
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=setup["raw"], max_retries=0)
    reply = client.chat.completions.create(
        model="chat", messages=CHAT["messages"], max_tokens=5, extra_headers={"X-Tokenwise-Tags": "Search, team:ml"},
        extra_body={"metadata": {"tags": ["beta", "search"], "purpose": "eval"}})
    assert reply.choices[0].message.content
    sent = primary.requests[-1].json
    assert sent["metadata"] == {"purpose": "eval"}  # the client's own metadata goes on, the tags do not
    assert "x-tokenwise-tags" not in primary.requests[-1].headers
    client.chat.completions.create(model="chat", messages=CHAT["messages"], max_tokens=5,
                                   metadata={"tags": "nightly,batch"})  # OpenAI's typed metadata: a string
    assert "metadata" not in primary.requests[-1].json  # nothing else was in it
    first, second = records(2)
    assert (first.tags, second.tags) == ("|search|team:ml|beta|", "|nightly|batch|")


@pytest.mark.parametrize("headers, body, words", [
    ({"x-tokenwise-tags": "has space"}, {}, "'has space' is not a tag"),
    ({}, {"metadata": {"tags": [1]}}, "tags must be strings, not int"),
    ({}, {"metadata": {"tags": {"a": "b"}}}, "metadata.tags must be a list of strings or one comma-separated string"),
    ({"x-tokenwise-tags": ",".join(f"t{i}" for i in range(9))}, {}, "at most 8 tags, not 9"),
])
def test_a_bad_tag_is_refused_with_the_reason_and_nothing_goes_upstream(gateway, setup, primary, headers, body,
                                                                        words):
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, **body}, timeout=30,
                          headers={"Authorization": f"Bearer {setup['raw']}", **headers})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_tags" and words in error["message"]
    assert primary.requests == []
    [row] = records(1)
    assert (row.status_code, row.error_kind, row.tags) == (400, "invalid_tags", None)


@pytest.fixture
def claude():
    with FakeMessagesUpstream(models=("claude-fake",), api_key="sk-ant-0000", apis="messages") as fake:
        yield fake


def test_a_messages_request_keeps_its_user_id_and_loses_its_tags_on_the_way_upstream(gateway, setup, claude):
    route_to(setup["team"], "claude", channel(setup["team"], "claude", claude, "claude-fake", key="sk-ant-0000",
                                              apis="messages"))
    client = anthropic.Anthropic(base_url=gateway.url, api_key=setup["raw"], max_retries=0)
    client.messages.create(model="claude", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                           metadata={"user_id": "u-1", "tags": ["agents"]})
    assert claude.requests[-1].json["metadata"] == {"user_id": "u-1"}
    with pytest.raises(anthropic.BadRequestError, match="is not a tag"):
        client.messages.create(model="claude", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                               extra_headers={"x-tokenwise-tags": "bad tag"})
    rows = records(2)  # in the order written: the first waits for its session lookup, the refusal has none
    refused = next(row for row in rows if row.error_kind == "invalid_tags")
    assert [row.tags for row in rows if row is not refused] == ["|agents|"]
    assert len(claude.requests) == 1
    assert httpx.post(f"{gateway.url}/v1/messages/count_tokens", headers={"x-api-key": setup["raw"]},
                      json={"model": "claude", "messages": [{"role": "user", "content": "hi"}],
                            "metadata": {"tags": ["agents"]}}).status_code == 200
    assert "metadata" not in claude.requests[-1].json


@pytest.fixture
def few_tags(transactional_db, request):
    from tests.support.gateway import gateway_for

    yield from gateway_for(request, TOKENWISE_TEAM_TAGS_PER_DAY="3")


def test_a_team_past_its_distinct_tags_of_the_day_is_refused_a_new_one_and_keeps_its_own(few_tags, setup, primary):
    def tagged(tags):
        return httpx.post(f"{few_tags.url}/v1/chat/completions", json=CHAT, timeout=30,
                          headers={"Authorization": f"Bearer {setup['raw']}", "x-tokenwise-tags": tags})

    assert tagged("a,b").status_code == 200 and tagged("c").status_code == 200
    sent = len(primary.requests)
    refused = tagged("a,d")
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "too_many_tags"
    assert "used its 3 distinct tags of the day" in error["message"] and "'d'" in error["message"]
    assert len(primary.requests) == sent  # nothing went upstream
    assert tagged("b,a").status_code == 200  # the day's tags are still served
    assert [row.status_code for row in records(4)] == [200, 200, 400, 200]
