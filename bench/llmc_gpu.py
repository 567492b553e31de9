"""Benchmark: llm-compressor quantization of a Qwen2.5-1.5B-shaped model with engine/llmc_quantize.py on a GPU host.

The model is made on the spot as bench/awq_gpu.py makes it (Qwen2.5-1.5B's shape, random bf16 weights from a
fixed seed, the demo model's tokenizer). Then engine/llmc_quantize.py runs each scheme exactly as a worker would
start it (default: fp8-dynamic, then w4a16-awq with the builtin calibration text, 128 samples x 512 tokens), and
for each: the wall time, the peak GPU memory and the size before and after, from the runner's own result.

Quality where it can run there: that machine has no vLLM, so engine/evaluate.py cannot serve the checkpoints;
instead transformers loads the original and each quantized checkpoint (compressed-tensors decompresses it) and
compares them on the held-out text of engine/evaluation_text.py: the perplexity of each and how often their most
likely next token agrees. The weights are random, so the perplexities are near the vocabulary size and say
little; the agreement and the perplexity change are what to read.

    python bench/llmc_gpu.py --tokenizer DIR_WITH_TOKENIZER_FILES [--out-dir DIR] [--schemes fp8-dynamic,w4a16-awq]
        [--layers 28 --hidden 1536 ...] [--max-calib-samples 128] [--group-size 128] [--no-quality]
        [--model CHECKPOINT_DIR]

It runs on a CPU host too (the quantization times of docs/benchmarks.md's CPU table: SmolLM2-135M's shape is
--layers 30 --hidden 576 --intermediate 1536 --heads 9 --kv-heads 3 --vocab 49152 --group-size 64; --model runs
the schemes on an existing checkpoint, such as the demo model, instead of building one).

Writes llmc_gpu_<scheme>.jsonl (the runner's lines) and llmc_gpu_summary.json to --out-dir. Not a test.
"""
import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import awq_gpu  # noqa: E402  (the same model builder and machine facts)

QUALITY_TOKENS = 4096
WINDOW = 512


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/llmc-bench"))
    parser.add_argument("--schemes", default="fp8-dynamic,w4a16-awq")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--intermediate", type=int, default=8960)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--max-calib-samples", type=int, default=128)
    parser.add_argument("--max-calib-seq-len", type=int, default=512)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--model", type=Path, help="an existing checkpoint to quantize (no model is built)")
    parser.add_argument("--no-quality", action="store_true")
    return parser.parse_args(argv)


def run_scheme(args, scheme, model_dir, out_model, lines_path):
    argv = [sys.executable, "-m", "engine.llmc_quantize", "--model", str(model_dir), "--out", str(out_model),
            "--scheme", scheme, "--calib", "builtin", "--max-calib-samples", str(args.max_calib_samples),
            "--max-calib-seq-len", str(args.max_calib_seq_len), "--group-size", str(args.group_size)]
    print("runner:", " ".join(argv), flush=True)
    started = time.monotonic()
    result = error = None
    with open(lines_path, "w") as log, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                        text=True, cwd=ROOT) as process:
        for line in process.stdout:
            log.write(line)
            if line.startswith("{"):
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if "log" not in message:
                    print(f"[{time.monotonic() - started:7.1f}s] {line.rstrip()[:300]}", flush=True)
                result = message.get("result", result)
                error = message.get("error", error)
        returncode = process.wait()
    return {"returncode": returncode, "wall_seconds": round(time.monotonic() - started, 2), "result": result,
            "error": error}


def held_out_ids(tokenizer_dir):
    from transformers import AutoTokenizer

    from engine import evaluation_text

    return evaluation_text.held_out_ids(AutoTokenizer.from_pretrained(str(tokenizer_dir)), QUALITY_TOKENS)


def measure(model_dir, ids):
    """(perplexity, most likely token per position) of the checkpoint in `model_dir`, with transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto", device_map=device).eval()
    total, count, argmax = 0.0, 0, []
    with torch.no_grad():
        for start in range(0, len(ids) - 1, WINDOW):
            chunk = torch.tensor([ids[start:start + WINDOW]], device=device)
            logits = model(input_ids=chunk).logits.float()[0, :-1]
            targets = chunk[0, 1:]
            total += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
            count += targets.numel()
            argmax.extend(logits.argmax(-1).tolist())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return math.exp(total / count), argmax


def quality(model_dir, out_model, ids, baseline):
    try:
        perplexity, argmax = measure(out_model, ids)
    except Exception as error:  # noqa: BLE001 (reported in the summary, the bench goes on)
        return {"error": f"{type(error).__name__}: {error}"[:600]}
    agreement = sum(a == b for a, b in zip(argmax, baseline["argmax"])) / len(argmax)
    return {"engine": "transformers (no vLLM on this machine)", "perplexity": round(perplexity, 3),
            "baseline_perplexity": round(baseline["perplexity"], 3),
            "perplexity_change_percent": round(100 * (perplexity / baseline["perplexity"] - 1), 3),
            "next_token_agreement_percent": round(100 * agreement, 2), "tokens": len(argmax)}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.work_dir, ignore_errors=True)
    model_dir = args.model or args.work_dir / "model"
    args.work_dir.mkdir(parents=True)
    facts = awq_gpu.machine()
    try:
        import compressed_tensors
        import llmcompressor

        facts.update(llmcompressor=llmcompressor.__version__, compressed_tensors=compressed_tensors.__version__)
    except Exception as error:  # noqa: BLE001
        facts["llmcompressor"] = f"not importable: {error}"
    summary = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": facts,
               "shape": {"hidden": args.hidden, "intermediate": args.intermediate, "layers": args.layers,
                         "heads": args.heads, "kv_heads": args.kv_heads, "vocab": args.vocab,
                         "tie_word_embeddings": True, "dtype": "bfloat16", "seed": args.seed},
               "calibration": {"samples": args.max_calib_samples, "seq_len": args.max_calib_seq_len}}
    print(json.dumps(summary), flush=True)
    if args.model is None:
        model_dir.mkdir()
        summary["model"] = awq_gpu.build_model(args, model_dir)
    else:
        summary["model"] = {"path": str(args.model)}
        summary.pop("shape")
    print("model:", json.dumps(summary["model"]), flush=True)
    baseline = None
    if not args.no_quality:
        ids = held_out_ids(args.tokenizer)
        perplexity, argmax = measure(model_dir, ids)
        baseline = {"perplexity": perplexity, "argmax": argmax}
        summary["baseline_perplexity"] = round(perplexity, 3)
    summary["runs"] = {}
    for scheme in [name.strip() for name in args.schemes.split(",") if name.strip()]:
        out_model = args.work_dir / f"model-{scheme}"
        run = run_scheme(args, scheme, model_dir, out_model, args.out_dir / f"llmc_gpu_{scheme}.jsonl")
        if baseline is not None and run["returncode"] == 0:
            run["quality"] = quality(model_dir, out_model, ids, baseline)
        if out_model.is_dir():
            run["output_files"] = {item.name: item.stat().st_size for item in sorted(out_model.iterdir())}
        summary["runs"][scheme] = run
        print(f"{scheme}:", json.dumps({key: value for key, value in run.items() if key != "output_files"}),
              flush=True)
        shutil.rmtree(out_model, ignore_errors=True)
    (args.out_dir / "llmc_gpu_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if all(run["returncode"] == 0 for run in summary["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
