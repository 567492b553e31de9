"""Evaluation runs: every case of a set's version answered by one candidate (a channel or a route, through the
gateway's entry point for the panel's own requests, so each answer is a usage row with endpoint "evaluation" and
its cost), each answer checked; the summary is the pass rate, the cost and the cost per accepted answer.

An answer from a local deployment also costs the GPU time it took: the deployment's price per hour × its latency,
as if the deployment served it alone (`gpu_cost` on the line, part of `cost`). The route's real traffic shares that
time and pays less per answer; what the run compares is variants measured the same way, on the same cases.

Checks that need another channel are answered first: `agrees` asks the named reference channel the same case,
`judge` asks the named judge channel whether the answer meets the criteria (PASS or FAIL on its first line)."""
import asyncio
import statistics
from decimal import Decimal

from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q

from panel.accounts.models import Membership
from panel.accounts.roles import role_for
from panel.channels.models import Channel, ChannelKind
from panel.evaluations.checks import MAX_ANSWER_CHARS, run_check
from panel.evaluations.models import EvalRun
from panel.gateway import panel_requests
from panel.gateway.panel_requests import CandidateError, candidate_resolve, candidate_spec, channel_candidate
from panel.gateway.upstream import connections_close
from panel.jobs.models import JobState
from panel.jobs.queues import LONG_QUEUE, long_run_admit
from panel.jobs.services import job_claim, job_created, job_enqueue, job_fail, job_heartbeat, job_succeed

ENDPOINT = "evaluation"  # the usage rows of an evaluation run's requests
SHOWN_ANSWER_CHARS = 2000
JUDGE_SYSTEM = ("You grade one answer against criteria. Reply with PASS or FAIL on the first line, then one short "
                "sentence saying why. Judge only what the criteria ask.")


def helper_channels(cases):
    """The channel names the cases' agrees and judge checks name."""
    return sorted({check["channel"] for case in cases for check in case["checks"]
                   if check["type"] in ("agrees", "judge") and "channel" in check})


def eval_run_launch(*, team, user, eval_set, candidate, version=None):
    """Queue a run of `version` of the set (its current one when None) on `candidate` ("channel:3" or "route:5") on
    the long queue;
    ValidationError, saving nothing, for an unknown or disabled candidate or a reference or judge channel the team
    does not have enabled, LongRunsFull while the team has as many long runs as it may."""
    try:
        spec = candidate_spec(team=team, key=candidate, field="candidate")
    except CandidateError as error:
        raise ValidationError({"candidate": [str(error)]}) from None
    version = version or eval_set.current()
    enabled = set(Channel.objects.filter(team=team, enabled=True).values_list("name", flat=True))
    missing = [name for name in helper_channels(version.cases) if name not in enabled]
    if missing:
        raise ValidationError({"candidate": [f"The set's checks ask channel {', '.join(missing)}, which your team "
                                             "does not have enabled: add it, or change the set."]})
    with transaction.atomic():
        long_run_admit(team)
        run = EvalRun.objects.create(team=team, created_by=user, eval_version=version, candidate=spec,
                                     queue=LONG_QUEUE)
        job_created(run, actor=user, reason=f"{eval_set.name} v{version.number} on {spec['label']}")
        job_enqueue(run, "panel.evaluations.tasks.run_evaluation")
    return run


def eval_run_execute(*, run_id, worker):
    run = EvalRun.objects.select_related("eval_version__eval_set").get(pk=run_id)
    if not job_claim(run, worker=worker):
        return False
    try:
        column = candidate_resolve(team=run.team, spec=run.candidate)
        helpers = {name: channel_candidate(run.team, name, retries=0)
                   for name in helper_channels(run.eval_version.cases)}
    except CandidateError as error:
        job_fail(run, kind="candidate_gone", reason=str(error))
        return True
    results = asyncio.run(_cases(run, column, helpers))
    if results is not None:
        job_succeed(run, result=summary(results))
    return True


async def _cases(run, column, helpers):
    """Every case in one event loop (the gateway's connection pools live in it), the row updated after each; None
    when the run was cancelled meanwhile."""
    cases, results = run.eval_version.cases, []
    prices = await sync_to_async(local_hourly_prices)(run.team_id)
    try:
        for number, case in enumerate(cases, start=1):
            state = await sync_to_async(job_heartbeat)(run, progress=100 * (number - 1) // len(cases),
                                                       phase=f"case {number} of {len(cases)}: {case['id']}")
            if state != EvalRun.CLAIMED:
                return None  # cancelled: the row says so
            results.append(await _case(case, column, helpers, team_id=run.team_id, prices=prices))
            await sync_to_async(EvalRun.objects.filter(pk=run.pk).update)(results=results)
    finally:
        await connections_close()
    return results


async def _ask(candidate, messages, max_tokens, team_id):
    """The candidate's answer to one conversation, as a panel_requests.Outcome."""
    payload = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    async for kind, value in panel_requests.ask(candidate, payload, team_id=team_id, endpoint=ENDPOINT):
        if kind == "done":
            return value


def local_hourly_prices(team_id):
    """The GPU price per hour of the team's engines, by channel name: a local channel's deployment's (None: the host
    has no price), a vLLM pool's GPUs × its price per GPU-hour (None: not set)."""
    channels = (Channel.objects.filter(team_id=team_id, kind=ChannelKind.LOCAL, deployment__isnull=False)
                .select_related("deployment__host"))
    prices = {channel.name: channel.deployment.hourly_price() for channel in channels}
    for pool in Channel.objects.filter(team_id=team_id, kind=ChannelKind.POOL):
        prices[pool.name] = pool.gpu_hourly_price()
    return prices


def answer_cost(metrics, prices):
    """(cost, GPU time cost) of one answer: the channel's token prices plus, for a priced local deployment, its
    price per hour × the answer's latency."""
    cost = Decimal(metrics.get("cost") or "0")
    hourly, ms = prices.get(metrics.get("channel", "")), metrics.get("latency_ms")
    if hourly is None or ms is None:
        return cost, None
    gpu = (Decimal(str(hourly)) * Decimal(str(ms)) / 3_600_000).quantize(Decimal("1e-10"))
    return cost + gpu, gpu


async def _case(case, column, helpers, *, team_id, prices):
    """One case: the candidate's answer, the helpers' answers its checks need, each check's verdict."""
    done = await _ask(column, case["messages"], case["max_tokens"], team_id)
    metrics = done.metrics()
    cost, gpu_cost = answer_cost(metrics, prices)
    line = {"id": case["id"], "answer": done.text[:SHOWN_ANSWER_CHARS],
            "ms": metrics.get("latency_ms"), "cost": format(cost, "f"),
            "gpu_cost": format(gpu_cost, "f") if gpu_cost is not None else None,
            "error": "" if done.ok else (done.diagnosis() or done.error_kind or "no answer")}
    if not done.ok:
        line.update(passed=False, checks=[{"passed": False, "words": f"no answer: {line['error']}"}
                                          for _ in case["checks"]])
        return line
    answer = done.text
    references, verdicts = {}, {}
    for check in case["checks"]:
        helper = helpers.get(check.get("channel", ""))
        if check["type"] == "agrees" and "channel" in check and check["channel"] not in references:
            reply = await _ask(helper, case["messages"], case["max_tokens"], team_id)
            references[check["channel"]] = reply.text if reply.ok else None
        elif check["type"] == "judge":
            verdicts[(check["channel"], check["criteria"])] = await _judge(helper, check["criteria"], answer,
                                                                           team_id)
    checks = []
    for check in case["checks"]:
        channel = check.get("channel", "")
        result = run_check(check, answer, reference=references.get(channel),
                           judge=lambda criteria, _answer, channel=channel: verdicts[(channel, criteria)])
        checks.append({"passed": result.passed, "words": result.words})
    line.update(passed=all(check["passed"] for check in checks), checks=checks)
    return line


async def _judge(column, criteria, answer, team_id):
    messages = [{"role": "system", "content": JUDGE_SYSTEM},
                {"role": "user", "content": f"Criteria: {criteria}\n\nAnswer:\n{answer[:MAX_ANSWER_CHARS]}"}]
    reply = await _ask(column, messages, 64, team_id)
    if not reply.ok:
        return False, f"the judge channel gave no verdict ({reply.diagnosis() or reply.error_kind})"
    text = reply.text.strip()
    verdict = text.split(None, 1)[0].strip(".:").upper() if text else ""
    return verdict == "PASS", f"the judge said: {text[:200]}" if text else "the judge said nothing"


def summary(results):
    """Pass rate, cost and cost per accepted answer of a run's lines."""
    passed = sum(1 for line in results if line["passed"])
    cost = sum((Decimal(line["cost"] or "0") for line in results), Decimal(0))
    times = sorted(line["ms"] for line in results if line["ms"] is not None)
    return {"cases": len(results), "passed": passed, "errors": sum(1 for line in results if line["error"]),
            "pass_rate": round(passed / len(results), 4) if results else None, "cost": format(cost, "f"),
            "cost_per_accepted": format(cost / passed, "f") if passed else None,
            "p50_ms": round(statistics.median(times), 1) if times else None,
            "p95_ms": round(times[min(len(times) - 1, int(0.95 * len(times)))], 1) if times else None}


def evidence_runs(team):
    """The runs that may judge a canary or the autopilot's candidates: those the panel queued itself (a canary's
    guard, the autopilot's re-checks) and those an admin started. A member's run is theirs to read, never evidence:
    rerun until one is lucky, it would decide an admin's canary."""
    role = role_for("autopilot.manage")
    admins = [membership.user_id for membership in Membership.objects.filter(team=team) if membership.allows(role)]
    return EvalRun.objects.filter(team=team).filter(Q(created_by__isnull=True) | Q(created_by__in=admins))


def candidates_ranked(version, *, evidence_only=False):
    """The latest finished run of each candidate on `version` (with `evidence_only`, of the evidence_runs: the
    comparison the autopilot decides from), cheapest accepted answer first (a candidate that passed nothing last,
    by pass rate)."""
    latest = {}
    runs = (evidence_runs(version.eval_set.team_id) if evidence_only else EvalRun.objects).filter(
        eval_version=version, state=JobState.SUCCEEDED)
    for run in runs.order_by("-finished_at", "-pk"):
        latest.setdefault((run.candidate.get("kind"), run.candidate.get("id")), run)

    def order(run):
        cost = run.result.get("cost_per_accepted")
        return (cost is None, Decimal(cost) if cost is not None else Decimal(0), -(run.result.get("pass_rate") or 0))

    return sorted(latest.values(), key=order)
