"""Runs inside the engine venv: measure a model's quality the way vLLM will serve it.

    ENGINE_PYTHON -m engine.evaluate --model DIR [--model DIR ...] [--lora ADAPTER_DIR ...] [--lora-only]
                                     [--file PROMPTS.jsonl] [--max-tokens 4096]

For each model, in a process of its own (one engine at a time, all of its memory back between models), vLLM's
offline engine loads the checkpoint exactly as a deployment would (its quantization from config.json) and:
- perplexity on the held-out text (engine/evaluation_text.py: stdlib sources that neither training nor the
  builtin calibration corpus uses), from the prompt log-probabilities, and the most likely token at each position
  (the panel compares these between two models: next-token agreement);
- greedy continuations (16 tokens) of a fixed prompt set;
- the built-in task set (engine/quality_tasks.py: JSON with given keys and values, one-word answers, copy,
  classify), greedy chat answers through the model's own chat template as the gateway would send them, scored;
- a user's evaluation file (JSONL: {"prompt": ...} or {"messages": [...]}, optionally "expected" and "json":
  true), answered greedily; an expected answer counts when the output starts with it;
- speed on this host's engine, one request at a time: time to the first token and tokens per second after it;
- the size on disk.

`--lora ADAPTER_DIR` (PEFT's adapter_config.json + adapter_model.safetensors) also measures the first --model with
that LoRA adapter applied, in a process of its own: vLLM's offline engine with LoRA on (one adapter slot more than
used: on a CPU a request without an adapter takes the last slot, which must stay empty) and the adapter's request on
every call, the perplexity's prompt log-probabilities included. Its result carries "adapter": ADAPTER_DIR.
`--lora-only`: the first --model is measured only with its adapters (its own measurement is kept from before).

A checkpoint vLLM cannot load at all (2- or 3-bit weights, kept for comparison) is measured the same way with
transformers instead (compressed-tensors decompresses it), and its result says so ("engine": "transformers").

JSON lines on stdout as every runner (phase/progress/log, then {"result": {"models": [...]}}), or an error with a
kind: engine_missing, unsupported_quantization, bad_file, oom, failed."""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from engine import compute_dtype, engine_probe, evaluate_transformers, evaluation_text, protocol, quality_tasks
from engine.evaluation_common import FILE_TOKENS, GREEDY_TOKENS, file_result, folder_size, held_out_windows, speed
from engine.protocol import JsonArgumentParser, RunnerError, say

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # loading bars would fold into the job log as one long line
# One process: the engine core runs in this one, so its memory is this process's and apply_model sees the model.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

MAX_FILE_PROMPTS = 200
# vLLM's --max-lora-rank takes one of these (vllm/config/lora.py, MaxLoRARanks); panel/registry/adapters.py holds the
# same list for the registration's check.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class EvaluationError(RunnerError):
    """A failure in words, with its kind (failed, bad_file, oom, ...)."""


def parse_args(argv):
    parser = JsonArgumentParser(description="Evaluate models as vLLM serves them.")
    parser.add_argument("--model", action="append", required=True, type=Path)
    parser.add_argument("--lora", action="append", default=[], type=Path,
                        help="also measure the first --model with this LoRA adapter applied (repeatable)")
    parser.add_argument("--lora-only", action="store_true",
                        help="measure the first --model only with its adapters, not on its own")
    parser.add_argument("--file", type=Path, default=None)
    parser.add_argument("--max-tokens", type=int, default=4096, help="held-out tokens for the perplexity")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one model, no relay
    return parser.parse_args(argv)


def read_prompt_file(path):
    """[{"messages"|"prompt", "expected"?, "json"?}] from a JSONL file, or EvaluationError naming the line."""
    if path is None:
        return []
    items = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise EvaluationError("bad_file", f"the evaluation file {path} cannot be read as UTF-8: {error}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as error:
            raise EvaluationError("bad_file", f"line {number} of the evaluation file is not JSON: {error}") from None
        if not isinstance(item, dict) or not (isinstance(item.get("prompt"), str)
                                              or isinstance(item.get("messages"), list)):
            raise EvaluationError("bad_file", f"line {number} of the evaluation file needs \"prompt\" (text) or "
                                              f"\"messages\" (a list)")
        items.append(item)
        if len(items) > MAX_FILE_PROMPTS:
            raise EvaluationError("bad_file", f"the evaluation file has more than {MAX_FILE_PROMPTS} prompts")
    if not items:
        raise EvaluationError("bad_file", "the evaluation file holds no prompts")
    return items


def perplexity(llm, windows, SamplingParams, lora=None):
    """(perplexity, tokens scored, the most likely token at each scored position)."""
    import math

    params = SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0)
    outputs = llm.generate([{"prompt_token_ids": window} for window in windows], params, use_tqdm=False,
                           lora_request=lora)
    total, count, argmax = 0.0, 0, []
    for window, output in zip(windows, outputs):
        for position, entry in enumerate(output.prompt_logprobs or []):
            if entry is None:
                continue
            total -= entry[window[position]].logprob
            count += 1
            best = min(entry.items(), key=lambda pair: pair[1].rank)
            argmax.append(best[0])
    return round(math.exp(total / count), 4), count, argmax


def vllm_can_load(config):
    """vLLM loads unquantized, AWQ/GPTQ and compressed-tensors checkpoints with 4- or 8-bit weights."""
    quantization = config.get("quantization_config") or {}
    if quantization.get("quant_method") != "compressed-tensors":
        return True
    bits = {((group or {}).get("weights") or {}).get("num_bits")
            for group in (quantization.get("config_groups") or {}).values()}
    return bits <= {4, 8, None}


def lora_rank(adapter_dir):
    """The smallest --max-lora-rank vLLM takes that holds the adapter's rank (adapter_config.json's `r`)."""
    try:
        rank = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8")).get("r")
    except (OSError, ValueError) as error:
        raise EvaluationError("failed", f"the adapter's adapter_config.json cannot be read: {error}") from None
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise EvaluationError("failed", "the adapter's adapter_config.json has no rank (r) as a whole number above 0")
    fitting = [allowed for allowed in LORA_RANKS if allowed >= rank]
    if not fitting:
        raise EvaluationError("failed", f"the adapter's rank {rank} is above vLLM's largest, {LORA_RANKS[-1]}")
    return fitting[0]


def evaluate_one(model_dir, *, file_items, max_tokens, adapter_dir=None):
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if not vllm_can_load(config):
        if adapter_dir is not None:
            raise EvaluationError("unsupported_quantization", f"vLLM cannot load {model_dir.name} (2- or 3-bit "
                                                              "weights): its adapters cannot be measured on it")
        return evaluate_transformers.evaluate_one(model_dir, config=config, file_items=file_items,
                                                  max_tokens=max_tokens)
    started = time.monotonic()
    label = model_dir.name + (f" with the adapter {adapter_dir.name}" if adapter_dir else "")
    say(phase=f"loading {label} in vLLM", progress=5)
    import torch
    from vllm import LLM, SamplingParams

    compute = compute_dtype.compute_dtype(torch, "cuda" if torch.cuda.is_available() else "cpu")
    if compute is not None:
        say(log=compute_dtype.describe(torch, "cpu"))
    max_positions = int(config.get("max_position_embeddings") or 2048)
    lora_options, lora = {}, None
    if adapter_dir is not None:
        from vllm.lora.request import LoRARequest

        # One slot more than used: a request without an adapter takes the last slot on a CPU, kept empty.
        lora_options = {"enable_lora": True, "max_loras": 2, "max_lora_rank": lora_rank(adapter_dir)}
        lora = LoRARequest(lora_name="measured-adapter", lora_int_id=1, lora_path=str(adapter_dir))
    llm = LLM(model=str(model_dir), enforce_eager=True, max_model_len=min(2048, max_positions), seed=0,
              max_num_seqs=16, trust_remote_code=False, gpu_memory_utilization=0.5,
              dtype="float32" if compute is not None else "auto", **lora_options)
    tokenizer = llm.get_tokenizer()
    result = {"path": str(model_dir), "size_bytes": folder_size(model_dir), "engine": "vllm",
              "quantization": (config.get("quantization_config") or {}).get("quant_method") or "none"}
    if adapter_dir is not None:
        result.update(adapter=str(adapter_dir), size_bytes=result["size_bytes"] + folder_size(adapter_dir))
    if not torch.cuda.is_available():
        # On a CPU, whether this processor's int8 products are exact: W8A8 measured where they saturate is worse
        # than the same model on a GPU (the report says so).
        result["int8_error"] = engine_probe.int8_product_error(torch)

    say(phase="perplexity on held-out text", progress=40)
    windows = held_out_windows(tokenizer, max_tokens)
    result["perplexity"], result["tokens_scored"], result["argmax"] = perplexity(llm, windows, SamplingParams, lora)

    say(phase="greedy continuations", progress=60)
    greedy = SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0)
    outputs = llm.generate(list(evaluation_text.AGREEMENT_PROMPTS), greedy, use_tqdm=False, lora_request=lora)
    result["greedy"] = [list(output.outputs[0].token_ids) for output in outputs]

    say(phase="the task set", progress=70)
    items = quality_tasks.tasks()
    answers = llm.chat([item["messages"] for item in items],
                       SamplingParams(max_tokens=quality_tasks.ANSWER_TOKENS, temperature=0.0), use_tqdm=False,
                       lora_request=lora)
    result["tasks"] = quality_tasks.score(items, [answer.outputs[0].text for answer in answers])

    say(phase="speed, one request at a time", progress=80)

    def generate(prompt, tokens):
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        return len(llm.generate([prompt], params, use_tqdm=False, lora_request=lora)[0].outputs[0].token_ids)

    result["speed"] = speed(generate)
    if file_items:
        say(phase=f"{len(file_items)} prompts of the evaluation file", progress=85)
        result["file"] = answer_file(llm, file_items, SamplingParams, lora)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def answer_file(llm, items, SamplingParams, lora=None):
    params = SamplingParams(max_tokens=FILE_TOKENS, temperature=0.0)
    chats = [item for item in items if "messages" in item]
    plain = [item for item in items if "messages" not in item]
    texts = {}
    if chats:
        answers = llm.chat([item["messages"] for item in chats], params, use_tqdm=False, lora_request=lora)
        for item, answer in zip(chats, answers):
            texts[id(item)] = answer.outputs[0].text
    if plain:
        answers = llm.generate([item["prompt"] for item in plain], params, use_tqdm=False, lora_request=lora)
        for item, answer in zip(plain, answers):
            texts[id(item)] = answer.outputs[0].text
    return file_result(items, [texts[id(item)] for item in items])


def classify(text):
    lowered = text.lower()
    if "out of memory" in lowered or "cannot allocate memory" in lowered:
        return "oom"
    if "no module named 'vllm'" in lowered:
        return "engine_missing"
    if any(words in lowered for words in ("quantization", "_c' object has no attribute", "not supported",
                                          "fp8", "compressed-tensors", "cpu_gemm_wna16")):
        return "unsupported_quantization"
    return "failed"


def run_child(model_dir, args, index, count, adapter_dir=None):
    """Evaluate one model (with `adapter_dir` applied, if given) in a child process; relay its phases scaled into
    this measurement's share of the bar."""
    argv = [sys.executable, "-m", "engine.evaluate", "--one", "--model", str(model_dir),
            "--max-tokens", str(args.max_tokens)]
    if adapter_dir is not None:
        argv += ["--lora", str(adapter_dir)]
    if args.file:
        argv += ["--file", str(args.file)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                             cwd=Path(__file__).resolve().parent.parent, errors="replace")
    result, error, tail = None, None, []
    for line in child.stdout:
        message = None
        if line.startswith("{"):
            try:
                message = json.loads(line)
            except ValueError:
                message = None
        if not isinstance(message, dict):
            tail = (tail + [line.rstrip()])[-40:]
            print(line.rstrip(), file=sys.stderr, flush=True)
            continue
        if "result" in message:
            result = message["result"]
        elif "error" in message:
            error = message["error"]
        elif "phase" in message:
            share = 100 / count
            say(phase=f"model {index + 1} of {count}: {message['phase']}",
                progress=int(index * share + share * float(message.get("progress", 0)) / 100))
        else:
            say(**message)
    code = child.wait()
    if result is not None and code == 0:
        return result
    if error:
        raise EvaluationError(error.get("kind", "failed"), error.get("reason", ""))
    text = "\n".join(tail)
    kind = classify(text)
    last = next((line for line in reversed(tail) if "Error" in line or "error" in line), tail[-1] if tail else "")
    what = model_dir.name + (f" with the adapter {adapter_dir.name}" if adapter_dir is not None else "")
    raise EvaluationError(kind, f"vLLM could not evaluate {what} (exit {code}): {last[:600]}")


def main(argv=None):
    return protocol.run(evaluate, parse_args=parse_args, classify=describe_failure, argv=argv)


def evaluate(args):
    file_items = read_prompt_file(args.file)
    missing = [str(path) for path in args.model if not (path / "config.json").is_file()]
    if missing:
        raise EvaluationError("failed", f"not a model folder (no config.json): {', '.join(missing)}")
    missing = [str(path) for path in args.lora if not (path / "adapter_config.json").is_file()]
    if missing:
        raise EvaluationError("failed", f"not a LoRA adapter (no adapter_config.json): {', '.join(missing)}")
    if args.lora_only and not args.lora:
        raise EvaluationError("failed", "--lora-only needs at least one --lora")
    if args.one:
        return evaluate_one(args.model[0].absolute(), file_items=file_items, max_tokens=args.max_tokens,
                            adapter_dir=args.lora[0].absolute() if args.lora else None)
    plain = args.model[1:] if args.lora_only else args.model
    runs = [(path, None) for path in plain] + [(args.model[0], adapter) for adapter in args.lora]
    models = [run_child(path.absolute(), args, index, len(runs), adapter.absolute() if adapter else None)
              for index, (path, adapter) in enumerate(runs)]
    say(phase="done", progress=100)
    return {"models": models, "file": str(args.file) if args.file else None}


def describe_failure(error, args):
    if isinstance(error, RunnerError) or not isinstance(error, Exception):
        return protocol.describe(error)
    return classify(str(error)), f"{type(error).__name__}: {error}"


if __name__ == "__main__":
    sys.exit(main())
