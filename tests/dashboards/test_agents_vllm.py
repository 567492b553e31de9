"""A replayed agent session of 20 turns through the gateway to the tiny shared engine: one session with growing
input, the Agents figures agreeing with the engine's own prefix-cache counters, the money saved what the channel's
prices give (tests/support/agent_replay.py; the same on the real chat model:
tests/registry/test_gguf_import_engine.py)."""
import pytest

from panel.accounts.keys import key_issue
from tests.support.agent_replay import replay_and_check
from tests.support.gateway_server import GatewayServer

TURNS = 20


@pytest.fixture
def deployment(shared_deployment, team_setup):
    return shared_deployment(team_setup["team_a"])


def test_a_replayed_agent_session_matches_the_engine_cache_counters_and_prices(deployment, team_setup):
    from django.db import connection

    team = team_setup["team_a"]
    _, raw = key_issue(team=team, user=None, name="review-bot")
    gateway = GatewayServer(connection.settings_dict["NAME"])
    try:
        replay_and_check(team=team, deployment=deployment, gateway_url=gateway.url, raw_key=raw, model="tiny-chat",
                         turns=TURNS)
    finally:
        gateway.stop()
