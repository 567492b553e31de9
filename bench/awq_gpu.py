"""Benchmark: AWQ quantization of a Qwen2.5-1.5B-shaped model with engine/quantize_runner.py on a GPU host.

No machine here reaches a model hub, so the model is made on the spot: Qwen2.5-1.5B's shape (hidden 1536,
intermediate 8960, 28 layers, 12 heads, 2 KV heads, vocab 151936, tied embeddings, bf16) with random weights from a
fixed seed, built directly on the GPU by transformers and saved with the demo model's tokenizer. The tokenizer has
4096 tokens and the vocabulary stays 151936 (the real model's parameter count): calibration only uses ids below
4096, which the embedding has. Then the runner quantizes it (4-bit, group 128, zero point, GEMM, builtin
calibration) exactly as a worker would start it, and the runner's JSON lines, its result and the wall time are
printed and written to OUT_DIR. With --check, tests/support/engine/awq_dequant_check.py compares the dequantized weights
with the originals (on the GPU).

    python bench/awq_gpu.py --tokenizer DIR_WITH_TOKENIZER_FILES [--out-dir DIR] [--work-dir /tmp/awq-bench]
        [--check] [--layers 28 --hidden 1536 ...]

Not a test: needs a GPU (runs on the CPU too, slowly, for a small --layers/--hidden), torch, transformers,
accelerate and AutoAWQ. docs/benchmarks.md says how it was run on an H200 and what it measured.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEQUANT_CHECK = ROOT / "tests" / "engine" / "awq_dequant_check.py"
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True,
                        help="a folder with tokenizer.json and tokenizer_config.json (the demo model's)")
    parser.add_argument("--out-dir", type=Path, default=Path(os.environ.get("OUT", ".")),
                        help="where the JSON lines and the summary go (default: $OUT or .)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/awq-bench"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--intermediate", type=int, default=8960)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--max-calib-samples", type=int, default=128)
    parser.add_argument("--check", action="store_true", help="dequantize and compare with the original weights")
    return parser.parse_args(argv)


def build_model(args, model_dir):
    """Random weights, fixed seed, made where they will be used (the GPU when there is one); saved in bf16."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer_config = json.loads((args.tokenizer / "tokenizer_config.json").read_text())
    tokens = json.loads((args.tokenizer / "tokenizer.json").read_text())["added_tokens"]
    ids = {token["content"]: token["id"] for token in tokens}
    eos = ids.get(tokenizer_config.get("eos_token"), 2)
    pad = ids.get(tokenizer_config.get("pad_token"), 0)
    config = Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=32768, hidden_act="silu", rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
        use_sliding_window=False, bos_token_id=pad, eos_token_id=eos, pad_token_id=pad, dtype="bfloat16",
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    started = time.monotonic()
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    parameters = sum(parameter.numel() for parameter in model.parameters())  # tied embedding counted once
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=[eos, pad], pad_token_id=pad)
    model.save_pretrained(str(model_dir), safe_serialization=True)
    for name in SIDE_FILES:
        if (args.tokenizer / name).is_file() and name != "generation_config.json":
            shutil.copyfile(args.tokenizer / name, model_dir / name)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"parameters": parameters, "build_seconds": round(time.monotonic() - started, 2), "device": device,
            "size_bytes": sum(item.stat().st_size for item in model_dir.iterdir() if item.is_file())}


def machine():
    import torch
    import transformers

    facts = {"python": platform.python_version(), "torch": torch.__version__,
             "transformers": transformers.__version__, "cpus": os.cpu_count()}
    try:
        import awq

        facts["autoawq"] = awq.__version__
    except Exception as error:  # noqa: BLE001 (reported, not fatal)
        facts["autoawq"] = f"not importable: {error}"
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
        facts["cuda"] = torch.version.cuda
    try:
        facts["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        pass
    return facts


def run_runner(args, model_dir, out_model, lines_path):
    argv = [sys.executable, "-m", "engine.quantize_runner", "--model", str(model_dir), "--out", str(out_model),
            "--w-bit", "4", "--group-size", "128", "--version", "GEMM", "--calib", "builtin",
            "--max-calib-samples", str(args.max_calib_samples), "--max-calib-seq-len", "512"]
    print("runner:", " ".join(argv), flush=True)
    started = time.monotonic()
    result = error = None
    with open(lines_path, "w") as log, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                        text=True, cwd=ROOT) as process:
        for line in process.stdout:
            log.write(line)
            if line.startswith("{"):
                print(f"[{time.monotonic() - started:7.1f}s] {line.rstrip()}", flush=True)
                message = json.loads(line)
                result = message.get("result", result)
                error = message.get("error", error)
        returncode = process.wait()
    return {"returncode": returncode, "wall_seconds": round(time.monotonic() - started, 2), "result": result,
            "error": error, "argv": argv}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.work_dir, ignore_errors=True)
    model_dir, out_model = args.work_dir / "qwen2.5-1.5b-shape", args.work_dir / "qwen2.5-1.5b-shape-awq"
    model_dir.mkdir(parents=True)
    summary = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(),
               "shape": {"hidden": args.hidden, "intermediate": args.intermediate, "layers": args.layers,
                         "heads": args.heads, "kv_heads": args.kv_heads, "vocab": args.vocab,
                         "tie_word_embeddings": True, "dtype": "bfloat16", "seed": args.seed}}
    print(json.dumps(summary), flush=True)
    summary["model"] = build_model(args, model_dir)
    print("model:", json.dumps(summary["model"]), flush=True)
    summary["run"] = run_runner(args, model_dir, out_model, args.out_dir / "awq_gpu_runner.jsonl")
    if args.check and summary["run"]["returncode"] == 0:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        started = time.monotonic()
        check = subprocess.run([sys.executable, str(DEQUANT_CHECK), str(model_dir), str(out_model),
                                "--device", device], capture_output=True, text=True)
        numbers = json.loads(check.stdout.strip().splitlines()[-1]) if check.returncode == 0 else {}
        numbers.pop("per_linear", None)
        summary["dequant_check"] = {"returncode": check.returncode, "seconds": round(time.monotonic() - started, 2),
                                    **numbers, "stderr_tail": check.stderr[-1500:] if check.returncode else ""}
    if out_model.is_dir():
        summary["output_files"] = {item.name: item.stat().st_size for item in sorted(out_model.iterdir())}
    (args.out_dir / "awq_gpu_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("summary:", json.dumps(summary), flush=True)
    return 0 if summary["run"]["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
