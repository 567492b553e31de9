"""Two keyed hashes of a request's system prompt, so the advisor can tell a prompt that defeats the prefix cache
(the same text except for a timestamp, an id or a name) without the prompt ever being stored.

`raw` hashes the system prompt as sent; `shape` hashes it with dynamic-looking spans replaced by placeholders.
Many raw hashes under one shape hash = one prompt whose dynamic part keeps every request from sharing a cached
prefix. The hashes are HMACs keyed by SECRET_KEY, so a stored hash cannot be checked against a guessed prompt."""
import hashlib
import hmac
import json
import re
from functools import lru_cache
from itertools import islice

from django.conf import settings

HASH_CHARS = 16  # 64 bits: plenty to tell prompts of one team apart
MAX_CHARS = 64 * 1024  # a prefix this long already decides the cache's fate; longer prompts are cut here

_CALENDAR_WORDS = frozenset(
    "January February March April May June July August September October November December Jan Feb Mar Apr Jun "
    "Jul Aug Sep Sept Oct Nov Dec Monday Tuesday Wednesday Thursday Friday Saturday Sunday Mon Tue Wed Thu Fri Sat "
    "Sun".split())
_NAME_CUES = ("username", "user name", "user", "name", "customer", "client", "patient", "student", "member",
              "account", "speaking with", "speaking to", "talking with", "talking to", "assisting", "helping", "hello",
              "hi", "dear")

# Speed matters: this runs on the gateway's event loop for every chat request. Both scans start with an ASCII
# digit or a capital letter, so the regular expression engine skips every other character without trying a match
# there; a cue word is looked for only in the few characters before a capitalised word. (One alternation of every
# pattern took 1.2 ms for a 2 KB prompt; this takes about a tenth of that, and a prompt seen before costs one HMAC.)
_DIGITS = re.compile(r"[0-9][\w:.,/+\-]*")
# A capital that starts a sentence is skipped inside the engine (the lookbehinds come after the first character so
# the fast skip to the next capital still applies).
_CAPITALISED = re.compile(r"[A-Z](?<![.!?] .)(?<!\n.)[a-zA-Z'-]*(?: [A-Z][a-zA-Z'-]+)?")
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_CJK_CUE_WORDS = ("用户", "客户", "昵称", "姓名", "名字")
_CJK_CUES = re.compile(r"(?:用户|客户|昵称|姓名|名字)(?:名|是|为)?[:：]?\s*([\u4e00-\u9fff]{1,4})")
_KINDS = [  # what a span with a digit is, for a readable mask; the first that matches names it
    ("uuid", re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")),
    ("datetime", re.compile(r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?)?"
                            r"(?:Z|[+-]\d{2}:?\d{2})?")),
    ("time", re.compile(r"\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?: ?[AaPp]\.?[Mm]\.?)?")),
    ("hex_id", re.compile(r"(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}")),
    ("number", re.compile(r"\d+(?:[.,]\d+)*")),
]


def _spans(text):
    """(start, end, kind) of every dynamic-looking span, possibly overlapping."""
    found = []
    for match in _DIGITS.finditer(text):
        start, end = match.start(), match.end()
        while start and text[start - 1] in _ID_CHARS:  # req_8f3k, a3f9c2e1: the letters before the digit
            start -= 1
        while end > start and text[end - 1] in ".,:/+-":  # the full stop after a number is not part of it
            end -= 1
        if text[end:end + 3].upper() in (" AM", " PM"):
            end += 3
        span = text[start:end]
        kind = next((name for name, pattern in _KINDS if pattern.fullmatch(span)), "id")
        found.append((start, end, kind))
    for match in _CAPITALISED.finditer(text):
        start = match.start()
        if start and text[start - 1].isalpha():
            continue
        word = match.group().split(" ")[0]
        if word.rstrip(".") in _CALENDAR_WORDS:
            found.append((start, start + len(word), "date"))
        elif _after_cue(text[max(0, start - 24):start]):
            found.append((start, match.end(), "name"))
    if any(cue in text for cue in _CJK_CUE_WORDS):
        for match in _CJK_CUES.finditer(text):
            found.append((match.start(1), match.end(1), "name"))
    return found


def _after_cue(before):
    """Whether `before` ends with a cue that a name follows: "user: ", "The user is ", "Hello, "."""
    before = before.lower().rstrip(" \t\r\n\"':=,")
    words = before.rsplit(None, 1)
    if len(words) == 2 and words[1] in ("is", "named", "called"):
        before = words[0]
    if not before.endswith(_NAME_CUES):
        return False
    cue = next(cue for cue in _NAME_CUES if before.endswith(cue))
    return len(before) == len(cue) or not before[-len(cue) - 1].isalnum()


def mask(text):
    """`text` with each dynamic-looking span replaced by <kind> (kept readable for tests and docs)."""
    parts, position = [], 0
    for start, end, kind in sorted(_spans(text), key=lambda span: (span[0], -span[1])):
        if start < position:  # inside a span already masked
            continue
        parts += [text[position:start], f"<{kind}>"]
        position = end
    parts.append(text[position:])
    return "".join(parts)


@lru_cache(maxsize=1)
def _key():
    return hashlib.sha256(b"tokenwise-system-prompt:" + settings.SECRET_KEY.encode()).digest()


def _hash(text):
    return hmac.new(_key(), text.encode("utf-8", "replace"), hashlib.sha256).hexdigest()[:HASH_CHARS]


def _conversation(body):
    """A body's messages: a chat or Messages request's `messages`, or a Responses request's input items (a list of
    objects; an embeddings body's `input` is strings)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return messages
    given = body.get("input")
    return given if isinstance(given, list) and all(isinstance(item, dict) for item in given) else []


def system_prompt(body):
    """The text of the leading system (or developer) messages of a chat request or of a Responses request's input
    (after its `instructions`), or of a Messages request's `system`, or "" when there is none."""
    parts = []
    system = body.get("system")
    if isinstance(system, str):
        parts.append(system)
    elif isinstance(system, list):
        parts.extend(block["text"] for block in system
                     if isinstance(block, dict) and isinstance(block.get("text"), str))
    if isinstance(body.get("instructions"), str):
        parts.append(body["instructions"])
    for message in _conversation(body):
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            break
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(part["text"] for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return "\n".join(parts)[:MAX_CHARS]


_shapes = {}  # raw hash -> shape hash: a prompt seen before (the usual case) is not masked again
SHAPE_CACHE_SIZE = 4096


def system_prompt_hashes(body):
    """{"system_prompt_hash", "system_prompt_shape_hash"} for a parsed request body; {} without a system prompt."""
    text = system_prompt(body)
    if not text:
        return {}
    raw = _hash(text)
    shape = _shapes.get(raw)
    if shape is None:
        if len(_shapes) >= SHAPE_CACHE_SIZE:
            _shapes.clear()
        shape = _shapes[raw] = _hash(mask(text))
    return {"system_prompt_hash": raw, "system_prompt_shape_hash": shape}


# --- prefix blocks: how much of a prompt repeats an earlier one, without the text ----------------------------------

MAX_BLOCKS = 512  # a longer prompt is compared on its first 512 blocks
PROMPT_CHUNK_CHARS = 2048  # a completions prompt (one string) is cut into blocks of this size


def prompt_blocks(body):
    """The prompt of a request as blocks in the order a model reads them: the tools, the (Anthropic) system
    prompt or the (Responses) instructions, then one block per message or input item; a completions prompt in
    fixed-size pieces. OpenAI chat, completions, Responses and Anthropic Messages bodies alike. A Responses input
    that is one string is a block only after tools or instructions: an embeddings body's is no agent's turn."""
    return list(islice(_blocks(body), MAX_BLOCKS))


def _blocks(body, tools_chars=None):
    """prompt_blocks, one block at a time (a reader of the prompt's head stops early). `tools_chars`: a reader
    of the head needs no more of the tools block than this many characters, and a tools list is written out only
    that far (a client's tools list may be megabytes)."""
    blocks = []
    tools = body.get("tools") or body.get("functions")
    if tools:
        blocks.append(_tools_json(tools, tools_chars))
    system = body.get("system")
    if isinstance(system, str) and system:
        blocks.append(system)
    elif isinstance(system, list) and system:
        blocks.append(json.dumps(system, sort_keys=True, ensure_ascii=False))
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        blocks.append(body["instructions"])
    yield from blocks
    conversation = _conversation(body)
    yield from (_message_block(message) for message in conversation)
    if isinstance(body.get("input"), str) and (blocks or conversation):
        yield body["input"]
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = "\x00".join(item for item in prompt if isinstance(item, str))
    if isinstance(prompt, str):
        yield from (prompt[start:start + PROMPT_CHUNK_CHARS] for start in range(0, len(prompt), PROMPT_CHUNK_CHARS))


def _tools_json(tools, chars=None):
    """The tools as sorted JSON; with `chars`, a text that starts with the same `chars` characters as the whole,
    written one tool at a time until it is that long."""
    if chars is None or not isinstance(tools, list):
        return json.dumps(tools, sort_keys=True, ensure_ascii=False)
    parts, length = [], 1
    for tool in tools:
        parts.append(json.dumps(tool, sort_keys=True, ensure_ascii=False))
        length += len(parts[-1]) + 2
        if length > chars:
            break
    else:
        return "[" + ", ".join(parts) + "]"
    return "[" + ", ".join(parts)


def _message_block(message):
    """A message as one block: its fields in the order sent, strings as they are (a JSON dump of every message
    cost three times the hashing), anything else as JSON."""
    if not isinstance(message, dict):
        return json.dumps(message, ensure_ascii=False)
    parts = []
    for name, value in message.items():
        parts.append(str(name))
        parts.append(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    return "\x00".join(parts)


def prefix_hashes(body):
    """(hashes, ends): hashes[i] is a keyed hash of blocks 0..i together (so two prompts share hashes[i] exactly
    when their first i+1 blocks are the same) and ends[i] the characters up to the end of block i. One pass of one
    HMAC over the prompt; the text is never kept."""
    running = hmac.new(_prefix_key(), digestmod=hashlib.sha256)
    hashes, ends, total = [], [], 0
    for block in prompt_blocks(body):
        data = block.encode("utf-8", "replace")
        running.update(len(data).to_bytes(4, "big"))
        running.update(data)
        hashes.append(running.copy().hexdigest()[:HASH_CHARS])
        total += len(block)
        ends.append(total)
    return hashes, ends


HEAD_CHARS = 1024  # about 250 tokens: prompts that open with this much of the same text share cache blocks worth having


def prompt_head_hash(body):
    """A keyed hash of the first HEAD_CHARS characters of the prompt as the model reads it (prompt_blocks), "" for
    a request without a prompt (embeddings). Requests whose prompts open alike -- by a system prompt, or by a
    document at the start of the user turn -- hash alike; a shorter prompt is hashed whole."""
    running = hmac.new(_prefix_key(), b"head:", digestmod=hashlib.sha256)
    left = HEAD_CHARS
    for block in _blocks(body, tools_chars=HEAD_CHARS):
        if left <= 0:
            break
        running.update(block[:left].encode("utf-8", "replace") + b"\x00")
        left -= len(block) + 1
    return "" if left == HEAD_CHARS else running.hexdigest()[:HASH_CHARS]


@lru_cache(maxsize=1)
def _prefix_key():
    return hashlib.sha256(b"tokenwise-prompt-prefix:" + settings.SECRET_KEY.encode()).digest()


def shared_blocks(hashes, earlier):
    """How many leading blocks `hashes` shares with `earlier` (both from prefix_hashes)."""
    low, high = 0, min(len(hashes), len(earlier))
    while low < high:  # chained hashes: equal at i means equal at every block before i
        middle = (low + high + 1) // 2
        if hashes[middle - 1] == earlier[middle - 1]:
            low = middle
        else:
            high = middle - 1
    return low
