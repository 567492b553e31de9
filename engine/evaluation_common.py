"""What engine/evaluate.py (vLLM) and engine/evaluate_transformers.py share: the budgets, the held-out windows and
how answers are scored (standard library only)."""
import json
from pathlib import Path

from engine import evaluation_text

WINDOW_TOKENS = 512
GREEDY_TOKENS = 16
JSON_TOKENS = 48
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


def json_result(texts):
    return {"total": len(texts), "valid": sum(is_json_object(text) for text in texts),
            "examples": [text[:200] for text in texts[:3]]}


def file_result(items, outputs):
    """The prompt file's answers scored: expected answers matched (an output that starts with it), JSON asked for
    and valid."""
    expected = [(item["expected"], text) for item, text in zip(items, outputs) if isinstance(item.get("expected"),
                                                                                             str)]
    wants_json = [text for item, text in zip(items, outputs) if item.get("json")]
    return {"total": len(items), "outputs": [text[:500] for text in outputs], "expected_total": len(expected),
            "expected_matched": sum(text.strip().startswith(want.strip()) for want, text in expected),
            "json_total": len(wants_json), "json_valid": sum(is_json_object(text) for text in wants_json)}
