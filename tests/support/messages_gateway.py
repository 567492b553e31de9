"""The test bench of the gateway's two chat APIs (tests/gateway/test_messages.py, test_client_shapes.py): a real
gateway process, a fake provider that speaks only Anthropic's Messages API and one that speaks only OpenAI chat
completions (and the OpenAI API's responses and embeddings), a route to each ("claude" and "local"), and a team key.
Fixtures, imported by the test modules that use them."""
from decimal import Decimal

import anthropic
import pytest

from panel.accounts.keys import key_issue
from tests.support.fake_messages_upstream import FakeMessagesUpstream
from tests.support.gateway import channel, gateway_for, route_to


@pytest.fixture
def gateway(transactional_db, request):
    yield from gateway_for(request, TOKENWISE_BUDGET_CACHE_SECONDS="0")


@pytest.fixture
def anthropic_fake():
    with FakeMessagesUpstream(models=("claude-fake",), api_key="sk-ant-0000", apis="messages", chunks=6,
                              cached_tokens=3, cache_write_tokens=2) as fake:
        yield fake


@pytest.fixture
def chat_fake():
    with FakeMessagesUpstream(models=("chat-fake",), api_key="sk-chat-1111", apis="chat", chunks=6) as fake:
        yield fake


@pytest.fixture
def setup(team_setup, anthropic_fake, chat_fake):
    team = team_setup["team_a"]
    cloud = channel(team, "claude", anthropic_fake, "claude-fake", key="sk-ant-0000", apis="messages",
                    price_input_per_million=Decimal("3"), price_output_per_million=Decimal("15"),
                    price_cached_per_million=Decimal("0.3"), price_cache_write_per_million=Decimal("3.75"))
    chat = channel(team, "chatty", chat_fake, "chat-fake", key="sk-chat-1111", apis="chat",
                   price_input_per_million=Decimal("1"), price_output_per_million=Decimal("2"))
    key, raw = key_issue(team=team, user=team_setup["alice"], name="agent")
    return {"team": team, "cloud": cloud, "chat": chat, "key": key, "raw": raw,
            "claude_route": route_to(team, "claude", cloud), "chat_route": route_to(team, "local", chat),
            **team_setup}


def client_for(gateway, raw):
    return anthropic.Anthropic(base_url=gateway.url, api_key=raw, max_retries=0)
