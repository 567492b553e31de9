"""An evaluation set's JSONL: one case per line, read and checked whole before anything is saved.

    {"id": "invoice-1", "prompt": "Extract the total as JSON.", "system": "Answer with JSON only.",
     "checks": [{"type": "json_schema", "schema": {...}}, {"type": "contains", "text": "42.50"}], "max_tokens": 128}

A case gives either `prompt` (a user message, with an optional `system` message) or `messages` (chat messages of
role system, user or assistant, ending with a user message), at least one check (evaluations/checks.py) and
optionally `max_tokens` (1-8192; 256 when left out) and an `id` (`case-<line>` when left out; unique in the set).
Blank lines are skipped."""
import json

from panel.evaluations.checks import MAX_CHECKS_PER_CASE, check_problems

MAX_BYTES = 2_000_000
MAX_CASES = 1000
MAX_MESSAGES = 50
MAX_CONTENT_CHARS = 32_000
MAX_ID_CHARS = 100
DEFAULT_MAX_TOKENS = 256
MAX_TOKENS_LIMIT = 8192
SHOWN_PROBLEMS = 30
CASE_KEYS = {"id", "prompt", "system", "messages", "checks", "max_tokens"}
ROLES = ("system", "user", "assistant")


class SetProblems(ValueError):
    """The JSONL cannot be saved: every problem found, each "line N: ..."."""

    def __init__(self, problems):
        self.problems = problems
        shown = problems[:SHOWN_PROBLEMS]
        more = len(problems) - len(shown)
        super().__init__("; ".join(shown) + (f"; and {more} more" if more else ""))


def parse_cases(text):
    """The cases of a JSONL text, normalised ({"id", "messages", "checks", "max_tokens"}); SetProblems listing every
    problem when any line is wrong (nothing is half-read)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise SetProblems(["the file is not UTF-8 text"]) from None
    if len(text.encode("utf-8")) > MAX_BYTES:
        raise SetProblems([f"the set is larger than {MAX_BYTES // 1_000_000} MB: split it"])
    problems, cases, ids = [], [], set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(cases) >= MAX_CASES:
            problems.append(f"line {number}: a set holds at most {MAX_CASES} cases")
            break
        case, found = _case(line, number)
        problems += [f"line {number}: {problem}" for problem in found]
        if case is None:
            continue
        if case["id"] in ids:
            problems.append(f"line {number}: the id {case['id']!r} is used by an earlier case")
        ids.add(case["id"])
        cases.append(case)
    if not cases and not problems:
        problems.append("the set has no cases: one JSON object per line")
    if problems:
        raise SetProblems(problems)
    return cases


def _case(line, number):
    try:
        data = json.loads(line)
    except ValueError as error:
        return None, [f"not JSON ({error})"]
    if not isinstance(data, dict):
        return None, ["a case is a JSON object such as {\"prompt\": \"...\", \"checks\": [{\"type\": \"json\"}]}"]
    problems = [f"unknown field {key!r} (a case has: {', '.join(sorted(CASE_KEYS))})"
                for key in data if key not in CASE_KEYS]
    case_id = data.get("id", f"case-{number}")
    if not isinstance(case_id, str) or not case_id.strip() or len(case_id) > MAX_ID_CHARS:
        problems.append(f"id must be a non-empty text of at most {MAX_ID_CHARS} characters")
    messages, found = _messages(data)
    problems += found
    checks = data.get("checks")
    if not isinstance(checks, list) or not checks:
        problems.append("checks must be a list of at least one check, such as [{\"type\": \"json\"}]")
    elif len(checks) > MAX_CHECKS_PER_CASE:
        problems.append(f"at most {MAX_CHECKS_PER_CASE} checks per case")
    else:
        for index, check in enumerate(checks, start=1):
            problems += [f"check {index}: {problem}" for problem in check_problems(check)]
    max_tokens = data.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        problems.append(f"max_tokens must be a whole number from 1 to {MAX_TOKENS_LIMIT}")
    if problems:
        return None, problems
    return {"id": case_id.strip(), "messages": messages, "checks": checks, "max_tokens": max_tokens}, []


def _messages(data):
    if ("prompt" in data) == ("messages" in data):
        return None, ["give either prompt (a user message) or messages (a chat), not both or neither"]
    if "prompt" in data:
        messages = ([{"role": "system", "content": data["system"]}] if "system" in data else []) + [
            {"role": "user", "content": data["prompt"]}]
    else:
        if "system" in data:
            return None, ["system goes with prompt; with messages, put a system message first"]
        messages = data["messages"]
        if not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES:
            return None, [f"messages must be a list of 1 to {MAX_MESSAGES} chat messages"]
    problems = []
    for index, message in enumerate(messages, start=1):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            problems.append(f"message {index} must be {{\"role\": ..., \"content\": ...}} and nothing else")
            continue
        if message["role"] not in ROLES:
            problems.append(f"message {index}: role must be one of {', '.join(ROLES)}")
        content = message["content"]
        if not isinstance(content, str) or not content.strip() or len(content) > MAX_CONTENT_CHARS:
            problems.append(f"message {index}: content must be a non-empty text of at most "
                            f"{MAX_CONTENT_CHARS:,} characters")
    if not problems and messages[-1]["role"] != "user":
        problems.append("the last message must be the user's (the model answers it)")
    return (messages if not problems else None), problems


def cases_jsonl(cases):
    """The cases as JSONL again (for download and for editing a new version): prompt and system where a case is one
    user message with an optional system message, messages otherwise."""
    lines = []
    for case in cases:
        messages = case["messages"]
        shaped = {"id": case["id"]}
        roles = [message["role"] for message in messages]
        if roles in (["user"], ["system", "user"]):
            if roles[0] == "system":
                shaped["system"] = messages[0]["content"]
            shaped["prompt"] = messages[-1]["content"]
        else:
            shaped["messages"] = messages
        shaped["checks"] = case["checks"]
        if case["max_tokens"] != DEFAULT_MAX_TOKENS:
            shaped["max_tokens"] = case["max_tokens"]
        lines.append(json.dumps(shaped, ensure_ascii=False))
    return "\n".join(lines) + "\n"
