"""What engine/evaluate.py (vLLM) and engine/evaluate_transformers.py share: the budgets, the held-out windows and
how answers are scored (standard library only)."""
import json
from pathlib import Path

from engine import evaluation_text

WINDOW_TOKENS = 512
GREEDY_TOKENS = 16
FILE_TOKENS = 64


def folder_size(path):
    return sum(item.stat().st_size for item in Path(path).rglob("*") if item.is_file())


def held_out_windows(tokenizer, max_tokens):
    """The held-out token ids in windows of WINDOW_TOKENS (each with at least two tokens to score)."""
    ids = evaluation_text.held_out_ids(tokenizer, max_tokens)
    return [ids[start:start + WINDOW_TOKENS] for start in range(0, len(ids), WINDOW_TOKENS)
            if len(ids[start:start + WINDOW_TOKENS]) > 1]


def is_json_object(text):
    try:
        return isinstance(json.loads(text.strip()), (dict, list))
    except ValueError:
        return False


def speed(generate, runs=3):
    """{"ttft_ms", "tokens_per_second"} of one request at a time on this engine, each the median of `runs`:
    `generate(prompt, max_tokens)` answers greedily (the end of text ignored) and returns the number of tokens made.
    TTFT is a one-token answer's time; the rate counts the tokens after the first over the time after the first."""
    import statistics
    import time

    def timed(prompt, tokens):
        started = time.perf_counter()
        made = generate(prompt, tokens)
        return time.perf_counter() - started, made

    first = statistics.median(timed(f"{SPEED_PROMPT} ({turn})", 1)[0] for turn in range(runs))
    rates = []
    for turn in range(runs):
        seconds, made = timed(f"{SPEED_PROMPT} [{turn}]", SPEED_TOKENS)
        rates.append((made - 1) / max(seconds - first, 1e-6))
    return {"ttft_ms": round(first * 1000, 1), "tokens_per_second": round(statistics.median(rates), 1)}


SPEED_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
SPEED_TOKENS = 32


def file_result(items, outputs):
    """The prompt file's answers scored: expected answers matched (an output that starts with it), JSON asked for
    and valid."""
    expected = [(item["expected"], text) for item, text in zip(items, outputs) if isinstance(item.get("expected"),
                                                                                             str)]
    wants_json = [text for item, text in zip(items, outputs) if item.get("json")]
    return {"total": len(items), "outputs": [text[:500] for text in outputs], "expected_total": len(expected),
            "expected_matched": sum(text.strip().startswith(want.strip()) for want, text in expected),
            "json_total": len(wants_json), "json_valid": sum(is_json_object(text) for text in wants_json)}
