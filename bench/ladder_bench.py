"""The config ladder on this machine, for docs/benchmarks.md (a script, not a test).

It sets up a private panel as the test run does (tests/support/bench_panel.py: a private Redis, an SQLite file,
real workers) and does what a user does on the pages:
register the demo model, quantize it with AWQ (a real AutoAWQ job on the GPU worker, here the CPU), then run the
ladder (FP16 baseline → + AWQ → + prefix caching → + larger max_num_seqs and chunked prefill) on one synthetic
workload, and print the seeds' table as Markdown. Engine starts: four, so run it under the heavy-run lock:

    [LADDER_REQUESTS=64 LADDER_PRICE=1.00 LADDER_BENCH_OUT=/tmp/ladder-bench.md] \
    flock /tmp/tw-heavy.lock .venv/bin/python -m bench.ladder_bench
"""
import json
import os
import platform
from decimal import Decimal
from pathlib import Path

from tests.support.bench_panel import bench_panel
from tests.support.waiting import wait_until


def main():
    with bench_panel() as lab:
        ladder_bench(lab)


def ladder_bench(lab):
    # The panel's modules are imported once bench_panel() has set Django up.
    from panel.benchmarks import ladder as ladders
    from panel.benchmarks.models import Ladder
    from panel.hosts.models import WorkerHost
    from panel.jobs.models import JobState
    from panel.registry.demo_model import build_demo_model
    from panel.registry.models import QuantizationJob
    from panel.registry.services import model_register, quantization_launch

    team, alice = lab.teams["team_a"], lab.teams["alice"]
    path = lab.tmp_path / "tiny"
    build_demo_model(path)
    model = model_register(team=team, user=alice, source=str(path), name="tiny")
    lab.start_worker("gpu")
    lab.start_worker("default")
    wait_until(lambda: WorkerHost.objects.filter(kind="gpu", last_seen__isnull=False).exists(), message="worker")

    # A small calibration set: the default (128 × 512 tokens) took over 15 minutes on 2 busy cores.
    job = quantization_launch(team=team, user=alice, source=model, max_calib_samples=32, max_calib_seq_len=256)
    wait_until(lambda: QuantizationJob.objects.get(pk=job.pk).is_final, seconds=1800, interval=2, message="AWQ")
    job.refresh_from_db()
    if job.state != JobState.SUCCEEDED:
        raise SystemExit(f"ladder_bench: the AWQ job ended {job.state}: {job.failure_reason}")

    requests = int(os.environ.get("LADDER_REQUESTS", "64"))
    workload = dict(workload="synthetic", input_tokens=256, output_tokens=64, shared_system_prompt=True,
                    requests=requests, warmup_requests=4, concurrency=16)
    ladder = ladders.ladder_launch(team=team, user=alice, model=model, small_max_num_seqs=2, large_max_num_seqs=32,
                                   max_model_len=1024, extra_args="--enforce-eager",
                                   gpu_price_per_hour=Decimal(os.environ.get("LADDER_PRICE", "1.00")), **workload)
    wait_until(lambda: Ladder.objects.get(pk=ladder.pk).is_final, seconds=3000, interval=2, message="the ladder")
    ladder.refresh_from_db()
    if ladder.state != JobState.SUCCEEDED:
        raise SystemExit(f"ladder_bench: the ladder ended {ladder.state}: {ladder.failure_reason}")

    ladder_write(ladders, ladder, Path(os.environ.get("LADDER_BENCH_OUT", "/tmp/ladder-bench.md")))


def ladder_write(ladders, ladder, out):
    """Print the ladder's table as Markdown and write it, with each step's figures as JSON, to `out`."""
    lines = [f"Ladder #{ladder.pk}, {ladder.workload_summary}; host {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores; price {ladder.gpu_price_per_hour} per hour", "",
             "| configuration | weights | output tok/s | gain | TTFT p50 / p99 | end-to-end p99 | cost per M tokens |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    rows = ladders.ladder_table(ladder)
    for row in rows:
        if row.get("figures"):
            f = row["figures"]
            gain = row.get("gain_vs_previous", "baseline")
            if row.get("gain_vs_baseline") and row["gain_vs_baseline"] != gain:
                gain += f" ({row['gain_vs_baseline']} vs baseline)"
            lines.append(f"| {row['label']} | {row['weights_bytes'] / 1e6:.1f} MB | {row['throughput']:.1f} | {gain} | "
                         f"{f['median_ttft_ms']:.0f} / {f['p99_ttft_ms']:.0f} ms | {f['p99_e2el_ms']:.0f} ms | "
                         f"{row['cost_per_million']:.2f} |")
        else:
            lines.append(f"| {row['label']} | {row['status']}: {row['reason']} | | | | | |")
    table = "\n".join(lines)
    print("\n" + table)
    out.write_text(table + "\n\n" + json.dumps([{k: v for k, v in row.items() if k in ("key", "status", "reason")}
                                                | ({"figures": row["figures"]} if row.get("figures") else {})
                                                for row in rows], indent=1) + "\n")


if __name__ == "__main__":
    main()
