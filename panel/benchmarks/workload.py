"""What a benchmark sends: the built-in prompt set, prompts read from an uploaded file, or synthetic prompts of a
given length. Each prompt is a list of chat messages."""
from django.core.exceptions import ValidationError

from panel.core import safejson

MAX_FILE_PROMPTS = 10_000
MAX_PROMPT_CHARS = 100_000

# Short, varied requests like the ones an inference service sees (questions, rewrites, code, JSON).
BUILTIN_PROMPTS = (
    "Explain in one sentence what PagedAttention does.",
    "What is a KV cache, and why does it grow with the sequence length?",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Summarize the trade-off between throughput and latency in batched inference.",
    "List three reasons a GPU can run out of memory while serving a language model.",
    "Translate to French: The deployment is ready and serving requests.",
    "Return a JSON object with the keys name, role and team for a user called Ada.",
    "What does 4-bit weight-only quantization save, and what can it cost?",
    "Give two tips for writing a system prompt that prefix caching can reuse.",
    "Rewrite more politely: Your request failed because you sent the wrong key.",
    "Explain continuous batching to a backend engineer in three sentences.",
    "What is the difference between time to first token and inter-token latency?",
    "Write a SQL query that counts requests per day from a table request_log(created_at).",
    "Why does tensor parallelism need the number of attention heads to divide evenly?",
    "Describe a canary rollout and when it should roll back.",
    "Suggest a name for a service that routes requests between local and cloud models.",
)

# ~1 token each in common BPE vocabularies, so n words make a prompt of about n tokens.
WORDS = ("the", "model", "serves", "tokens", "with", "a", "cache", "of", "keys", "and", "values", "for", "each",
         "request", "in", "batch", "while", "memory", "stays", "low", "when", "weights", "are", "small", "so",
         "more", "users", "fit", "on", "one", "card", "today")


def builtin_prompts():
    return [[{"role": "user", "content": text}] for text in BUILTIN_PROMPTS]


def _words(count, offset):
    return " ".join(WORDS[(offset + index * 7) % len(WORDS)] for index in range(count))


def synthetic_prompts(*, count, input_tokens, shared_system_prompt):
    """`count` distinct prompts of about `input_tokens` tokens. With `shared_system_prompt`, about half of them is
    the same system message in every request (what prefix caching reuses); without it, every prompt starts with
    its own number so no two share a prefix."""
    prompts = []
    system_words = input_tokens // 2 if shared_system_prompt else 0
    system = "You are a careful assistant. " + _words(max(system_words - 6, 0), 0) if system_words else ""
    for index in range(count):
        user = f"Request {index}: " + _words(max(input_tokens - system_words - 3, 1), index)
        messages = [{"role": "system", "content": system}] if system else []
        prompts.append(messages + [{"role": "user", "content": user}])
    return prompts


def _messages_from_json(value, line_number):
    where = f"line {line_number}"
    if isinstance(value, str):
        value = {"prompt": value}
    if not isinstance(value, dict):
        raise ValidationError(f"{where}: expected an object with \"prompt\" or \"messages\", "
                              f"got {type(value).__name__}.")
    if "messages" in value:
        messages = value["messages"]
        if (not isinstance(messages, list) or not messages
                or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                           for m in messages)):
            raise ValidationError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} "
                                  "objects with string values.")
        unknown = {m["role"] for m in messages} - {"system", "user", "assistant"}
        if unknown:
            raise ValidationError(f"{where}: unknown role(s) {', '.join(sorted(unknown))}; use system, user or "
                                  "assistant.")
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    prompt = value.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValidationError(f"{where}: needs a non-empty \"prompt\" string or a \"messages\" list.")
    return [{"role": "user", "content": prompt}]


def parse_prompt_file(data, *, name, max_bytes):
    """The prompts of an uploaded file: JSONL (one {"prompt": ...} or {"messages": [...]} per line, name ending in
    .jsonl/.json) or plain text (one prompt per non-empty line). ValidationError with the line that is wrong."""
    if len(data) > max_bytes:
        raise ValidationError(f"The file is {len(data):,} bytes; the limit is {max_bytes:,} bytes.")
    if b"\x00" in data:
        raise ValidationError("The file contains NUL bytes: it looks binary. Upload UTF-8 text or JSONL.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValidationError(f"The file is not UTF-8 text (byte {error.start} cannot be decoded).") from None
    lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ValidationError("The file has no prompts: it is empty or only blank lines.")
    if len(lines) > MAX_FILE_PROMPTS:
        raise ValidationError(f"The file has {len(lines):,} prompts; at most {MAX_FILE_PROMPTS:,} are allowed.")
    jsonl = name.lower().endswith((".jsonl", ".json"))
    prompts = []
    for number, line in lines:
        if len(line) > MAX_PROMPT_CHARS:
            raise ValidationError(f"line {number}: {len(line):,} characters; one prompt may have at most "
                                  f"{MAX_PROMPT_CHARS:,}.")
        if jsonl:
            try:
                value = safejson.loads(line)
            except safejson.NestedTooDeep:
                raise ValidationError(f"line {number} is nested too deeply to be a prompt.") from None
            except ValueError as error:
                raise ValidationError(f"line {number} is not valid JSON ({error.msg} at column "
                                      f"{error.colno}).") from None
            prompts.append(_messages_from_json(value, number))
        else:
            prompts.append([{"role": "user", "content": line}])
    return prompts
