"""Shadow traffic: after a client's request on a route with a running shadow test has been answered, a share of
them is sent again to the test's candidate in the background (never to the client, which has its whole answer by
then), through the gateway's pipeline by the panel's front door (`panel_requests.ask`: the candidate's retries and
timeouts, the team's budget holds, one usage row with endpoint `shadow`). The candidate's answer is judged against
the one the client got and recorded by `channels.shadow.shadow_record`, which stops the test when its budget is spent
or the candidate keeps failing. At most MAX_IN_FLIGHT copies run at once per gateway process; a request past that is
simply not mirrored. The candidate is asked in chat completions, with the conversation as text messages."""
import asyncio
import logging
import random
import time
from decimal import Decimal

from asgiref.sync import sync_to_async

from panel.channels.routing import channel_route
from panel.channels.shadow import shadow_record
from panel.core.similarity import similarity
from panel.gateway.panel_requests import Candidate, ask
from panel.gateway.responses import is_json
from panel.gateway.sampling import SAMPLED_ENDPOINTS, conversation_of

log = logging.getLogger("panel.gateway")

MAX_IN_FLIGHT = 4
DEFAULT_MAX_TOKENS = 1024
DEADLINE_SECONDS = 300  # one mirrored request, whatever the candidate's own timeouts say
_tasks = set()


def mirror_maybe(exchange, rng=random):
    """Send a copy of the answered request to the shadow test's candidate, in the background, if it is drawn."""
    plan = exchange.shadow
    fields = exchange.fields
    if (plan is None or not exchange.responded or fields["outcome"] != "ok" or fields["status_code"] != 200
            or fields["endpoint"] not in SAMPLED_ENDPOINTS or exchange.body is None):
        return None
    if rng.random() * 100 >= plan.percent or len(_tasks) >= MAX_IN_FLIGHT:
        return None
    body = exchange.body
    payload = {"messages": conversation_of(fields["endpoint"], body),
               "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens")
               or body.get("max_output_tokens") or DEFAULT_MAX_TOKENS}
    if fields["json_requested"]:
        payload["response_format"] = body["response_format"]
    task = asyncio.create_task(_mirror(
        plan, team_id=exchange.owner_team_id, payload=payload,
        client_answer="".join(exchange.answer_parts), json_requested=fields["json_requested"],
        client_latency_ms=(time.perf_counter() - exchange.started) * 1000,
        client_cost=fields.get("cost") or Decimal(0)))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task


async def _mirror(plan, *, team_id, payload, client_answer, json_requested, client_latency_ms,
                  client_cost):
    outcome = None
    try:
        async with asyncio.timeout(DEADLINE_SECONDS):
            candidate = Candidate(index=0, kind="channel", id=plan.target.id, label=plan.target.name,
                                  route=channel_route(plan.target))
            async for kind, value in ask(candidate, payload, team_id=team_id, endpoint="shadow"):
                if kind == "done":
                    outcome = value
    except TimeoutError:
        pass
    if outcome is None:
        fields = dict(ok=False, error=f"no answer within {DEADLINE_SECONDS} s")
    elif not outcome.ok:
        fields = dict(ok=False, error=str(outcome.error)[:200], cost=outcome.cost)
    else:
        agreement = similarity(outcome.text, client_answer)
        json_valid = is_json(outcome.text) if json_requested else None
        fields = dict(ok=True, latency_ms=(outcome.ended - outcome.started) * 1000, similarity=agreement,
                      json_valid=json_valid, cost=outcome.cost,
                      prompt_tokens=outcome.exchange.fields["prompt_tokens"],
                      completion_tokens=outcome.exchange.fields["completion_tokens"],
                      passed=agreement >= plan.min_similarity and json_valid is not False)
    try:
        await sync_to_async(shadow_record, thread_sensitive=False)(
            shadow_id=plan.id, client_latency_ms=client_latency_ms, client_cost=client_cost, **fields)
    except Exception:
        log.exception("shadow test %s: the result of a mirrored request was not recorded", plan.id)
