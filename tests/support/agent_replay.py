"""A replayed agent session through the gateway to a local vLLM deployment, checked against the engine: turns whose
context grows by a tool call and its result each turn (written into the history, since a model of this size does not
call tools reliably by itself), all with one x-session-id. The usage rows form one session with growing input; the
Agents figures agree with the engine's own prefix-cache counters; the money saved is what the channel's prices give.
Used on the tiny shared engine (tests/dashboards/test_agents_vllm.py) and on the real chat model
(tests/registry/test_gguf_import_engine.py)."""
from decimal import Decimal

import httpx
import openai

from panel.channels.models import Channel
from panel.core.money import money_text
from panel.dashboards.agents import agent_sessions
from panel.dashboards.pages import dashboard_page
from panel.dashboards.scraper import metrics_headers, metrics_url, parse_metrics
from panel.dashboards.selectors import DashboardQuery
from panel.usage.models import RequestLog
from tests.support.waiting import wait_until

SESSION = "review-replay-1"
SYSTEM = ("You are a code-review agent. Read the files you need with the read_file tool, then list the bugs you "
          "found, one per line, with the file and the line number. Be brief.")
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def _source(turn):
    """A tool result: a short Python file, different each turn (about 50 tokens of the demo model)."""
    return (f"def handler_{turn}(request):\n    total = 0\n    for item in request.items:\n"
            f"        total += item.price * {turn}\n    return total\n")


def _history(turns):
    """The conversation after `turns` - 1 tool rounds: the ask, then per round the assistant's read_file call and
    the tool's answer. Each turn's prompt extends the previous one."""
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Review the change in the handlers package."}]
    for turn in range(1, turns):
        messages.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": f"call_{turn:02d}", "type": "function",
            "function": {"name": "read_file", "arguments": f'{{"path": "handlers/h{turn}.py"}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{turn:02d}", "content": _source(turn)})
    return messages


def _prefix_counters(deployment):
    counters = parse_metrics(httpx.get(metrics_url(deployment), headers=metrics_headers(deployment),
                                          timeout=10).text)["counters"]
    return counters.get("prefix_queries", 0.0), counters.get("prefix_hits", 0.0)


def replay_and_check(*, team, deployment, gateway_url, raw_key, model, turns):
    """Replay `turns` turns of one session through the gateway at `gateway_url` to `deployment` (nothing else may
    reach its engine meanwhile), then check the rows, the Agents figures and the money against the engine."""
    local = Channel.objects.get(deployment=deployment)
    Channel.objects.filter(pk=local.pk).update(
        price_input_per_million=Decimal("2.00"), price_output_per_million=Decimal("8.00"),
        price_cached_per_million=Decimal("0.20"), price_cache_write_per_million=None)
    local.refresh_from_db()
    queries_before, hits_before = _prefix_counters(deployment)
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=raw_key, max_retries=0, timeout=120,
                           default_headers={"x-session-id": SESSION})
    for turn in range(1, turns + 1):
        reply = client.chat.completions.create(model=model, max_tokens=4, tools=TOOLS, tool_choice="none",
                                               messages=_history(turn))
        assert reply.usage.prompt_tokens < deployment.profile.max_model_len - 4, reply.usage
    # The gateway writes its rows in batches: wait for them while it runs (a deadline that holds on 2 busy cores).
    session_rows = RequestLog.objects.filter(session_id=SESSION)
    wait_until(lambda: session_rows.count() >= turns, seconds=60, message="usage records")
    queries_after, hits_after = _prefix_counters(deployment)
    rows = list(session_rows.order_by("created_at"))
    # One session of its turns, on the local channel, with input growing every turn.
    assert [(row.outcome, row.session_id, row.session_turn) for row in rows] == [
        ("ok", SESSION, turn) for turn in range(1, turns + 1)], [(row.outcome, row.error_kind) for row in rows]
    assert all(row.channel_id == local.pk for row in rows)
    inputs = [row.prompt_tokens for row in rows]
    assert all(later > earlier for earlier, later in zip(inputs, inputs[1:])), inputs

    query = DashboardQuery(team=team, range="24h")
    (session,) = [found for found in agent_sessions(query) if found.session_id == SESSION]
    assert session.session_id == SESSION and len(session.turns) == turns and session.input_tokens == sum(inputs)
    cache_share = 100 * session.cached_tokens / session.input_tokens
    repeated_share = 100 * session.repeated_tokens / session.input_tokens
    queries, hits = queries_after - queries_before, hits_after - hits_before
    engine_share = 100 * hits / queries
    print(f"\nturn inputs {inputs}\ncached per turn {[row.cached_tokens for row in rows]}\n"
          f"engine: {hits:.0f} hits of {queries:.0f} queried tokens = {engine_share:.2f}%; rows: "
          f"{session.cached_tokens} cached of {session.input_tokens} = {cache_share:.2f}%; "
          f"repeated prefix {repeated_share:.2f}%")
    # The cache share is the engine's own per-request count of cached tokens, summed over the same prompts the
    # engine's counters saw (nothing else reached this engine during the replay): the two agree to rounding.
    assert queries == session.input_tokens
    assert abs(cache_share - engine_share) < 0.5
    # The repeated-prefix share is measured on the request's messages (characters, message by message), the
    # engine's hits on whole blocks of the templated prompt: each turn the engine misses up to one block (the
    # partly filled last block of the previous prompt) that the gateway counts as repeated. So they differ by at
    # most one block per turn of the session's input, plus a point for characters against tokens: 5 points on
    # the tiny model's 20 turns, 10 on the real model's 8 shorter ones (measured 5.2 there).
    blocks = 100 * turns * deployment.profile.block_size / session.input_tokens
    assert abs(repeated_share - engine_share) < blocks + 1, (repeated_share, engine_share, blocks)
    assert engine_share > 50  # the replay really was served mostly from the cache

    # Money: billed at the channel's prices (cached input at its cached price), against every input token at the
    # input price; the difference is exactly the cached tokens at (input - cached) price.
    expected_billed = sum(local.cost(row.prompt_tokens, row.completion_tokens, row.cached_tokens) for row in rows)
    assert session.billed == expected_billed
    assert session.uncached == sum(local.cost(row.prompt_tokens, row.completion_tokens, 0) for row in rows)
    saved = session.uncached - session.billed
    assert saved == Decimal(session.cached_tokens) * (Decimal("2.00") - Decimal("0.20")) / 1_000_000
    assert saved > 0
    # The tab shows the same figures on its cards.
    cards = {title: (value, note) for title, value, note in dashboard_page(tab="agents", query=query).cards}
    assert cards["Sessions"] == ("1", f"{turns} turns")
    assert cards["From cache"][0] == f"{round(engine_share, 2):.1f}%"
    assert cards["Repeated prefix"][0] == f"{round(repeated_share, 2):.1f}%"
    assert cards["Billed"] == (money_text(expected_billed), f"without caching {money_text(session.uncached)}; "
                                                            f"saved {money_text(saved)}")
    print(f"billed {session.billed}, without caching {session.uncached}, saved {saved}")
