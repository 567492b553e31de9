"""Two keyed hashes of a request's system prompt, so the advisor can tell a prompt that defeats the prefix cache
(the same text except for a timestamp, an id or a name) without the prompt ever being stored.

`raw` hashes the system prompt as sent; `shape` hashes it with dynamic-looking spans replaced by placeholders.
Many raw hashes under one shape hash = one prompt whose dynamic part keeps every request from sharing a cached
prefix. The hashes are HMACs keyed by SECRET_KEY, so a stored hash cannot be checked against a guessed prompt."""
import hashlib
import hmac
import re
from functools import lru_cache

from django.conf import settings

HASH_CHARS = 16  # 64 bits: plenty to tell prompts of one team apart
MAX_CHARS = 64 * 1024  # a prefix this long already decides the cache's fate; longer prompts are cut here

_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
           "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
_DAYS = "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday|Mon|Tue|Wed|Thu|Fri|Sat|Sun"
_NAME_CUES = (r"user|username|user name|name|customer|client|patient|student|member|account|speaking (?:with|to)|"
              r"talking (?:with|to)|assisting|helping|hello|hi|dear")
# Order matters: longer, more specific shapes first, so a UUID is not eaten as numbers.
_SPANS = [
    ("uuid", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    ("datetime", r"\b\d{4}[-/.]\d{1,2}[-/.]\d{1,2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?)?"
                 r"(?:\s?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2}))?"),
    ("cjk_date", r"\d{2,4}年\d{1,2}月\d{1,2}日(?:\s*\d{1,2}[:：]\d{2}(?:[:：]\d{2})?)?"),
    ("time", r"\b\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:\s?[AaPp]\.?[Mm]\.?)?"),
    ("month_date", rf"\b(?:{_DAYS}),?\s|\b(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b"
                   rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:{_MONTHS})\.?(?:,?\s+\d{{4}})?\b"),
    ("hex_id", r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"),
    ("token_id", r"\b[A-Za-z]{2,12}[_-](?=[A-Za-z0-9]*\d)[A-Za-z0-9]{4,}\b"),
    ("name", rf"(?i:\b(?:{_NAME_CUES}))\b(?:\s+(?:is|named|called))?\s*[:=,]?\s*"
             r"[\"']?[A-Z][a-zA-Z'-]+(?:\s+[A-Z][a-zA-Z'-]+)?"),
    ("cjk_name", r"(?:用户|客户|昵称|姓名|名字)(?:名|是|为)?[:：]?\s*[\u4e00-\u9fff]{1,4}"),
    ("number", r"\d+(?:[.,]\d+)*"),
]
_PATTERN = re.compile("|".join(f"(?P<{name}>{pattern})" for name, pattern in _SPANS))


def mask(text):
    """`text` with each dynamic-looking span replaced by <kind> (kept readable for tests and docs)."""
    return _PATTERN.sub(_placeholder, text)


def _placeholder(match):
    kind = match.lastgroup
    if kind == "name":  # keep the cue ("user: "), mask only the name after it
        words = match.group(0)
        cue = re.match(rf"(?i:\b(?:{_NAME_CUES}))\b(?:\s+(?:is|named|called))?\s*[:=,]?\s*[\"']?", words)
        return words[:cue.end()] + "<name>"
    if kind == "cjk_name":
        return re.sub(r"[\u4e00-\u9fff]{1,4}$", "<name>", match.group(0))
    return f"<{kind}>"


@lru_cache(maxsize=1)
def _key():
    return hashlib.sha256(b"tokenwise-system-prompt:" + settings.SECRET_KEY.encode()).digest()


def _hash(text):
    return hmac.new(_key(), text.encode("utf-8", "replace"), hashlib.sha256).hexdigest()[:HASH_CHARS]


def system_prompt(body):
    """The text of the leading system (or developer) messages of a chat request, or "" when there is none."""
    parts = []
    for message in body.get("messages") or ():
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            break
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(part["text"] for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return "\n".join(parts)[:MAX_CHARS]


def system_prompt_hashes(body):
    """{"system_prompt_hash", "system_prompt_shape_hash"} for a parsed request body; {} without a system prompt."""
    text = system_prompt(body)
    if not text:
        return {}
    return {"system_prompt_hash": _hash(text), "system_prompt_shape_hash": _hash(mask(text))}
