"""Agent sessions: which session a request belongs to, its turn in it, and how much of its prompt repeats the
previous turn's, so the Agents dashboard can show how an agent's context grows and what caching saved.

A request belongs to a session by, in this order: its `x-session-id` header; an Anthropic body's
`metadata.user_id`; else prefix chaining, where a request whose prompt extends an earlier prompt of the same key
(the earlier prompt's blocks are its first blocks) joins that prompt's session, and any other starts a new one.
Only keyed hashes of the prompt's prefix blocks (gateway/fingerprint.py) are kept, in Redis for SESSION_SECONDS;
never the text. If Redis cannot be reached the request is served without session fields."""
import hashlib
import hmac
import json
import logging
import secrets

from django.conf import settings
from redis.exceptions import RedisError

from panel.core.redis_client import async_redis
from panel.gateway import fingerprint

log = logging.getLogger(__name__)

SESSION_SECONDS = 2 * 3600  # an agent idle this long starts a new session
SESSION_ID_CHARS = 64
SESSION_HEADER = "x-session-id"


def _header(headers, wanted):
    for name, value in headers:
        if name.decode("latin-1").lower() == wanted:
            return value.decode("latin-1").strip()
    return ""


def _clean_id(raw):
    """A client's session id as stored: printable, at most 64 characters (a longer one by its keyed hash)."""
    text = "".join(char for char in raw if 32 < ord(char) < 127)
    if len(text) <= SESSION_ID_CHARS:
        return text
    digest = hmac.new(settings.SECRET_KEY.encode(), text.encode(), hashlib.sha256).hexdigest()[:32]
    return f"{text[:SESSION_ID_CHARS - 33]}~{digest}"


def declared_session(body, headers):
    """The session id the client names (the header, else metadata.user_id), or ""."""
    named = _header(headers, SESSION_HEADER)
    if not named:
        metadata = body.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
        named = user_id if isinstance(user_id, str) else ""
    return _clean_id(named) if named else ""


def _state_key(team_id, session_id):
    return f"tw:session:{team_id}:{session_id}"


def _prefix_key(key_id, digest):
    return f"tw:prefix:{key_id}:{digest}"


async def session_fields(*, team_id, key_id, body, headers):
    """{"session_id", "session_turn", "repeated_share"} for one request ({} when Redis is unreachable)."""
    hashes, ends = fingerprint.prefix_hashes(body)
    if not hashes:
        return {}
    try:
        return await _resolve(team_id, key_id, body, headers, hashes, ends)
    except (RedisError, OSError, ValueError) as error:
        log.warning("session of a request of key %s not resolved (%s)", key_id, type(error).__name__)
        return {}


async def _resolve(team_id, key_id, body, headers, hashes, ends):
    client = async_redis()
    session_id = declared_session(body, headers)
    if not session_id:
        # The longest earlier prompt of this key that this one extends: its hash is one of ours.
        found = await client.mget([_prefix_key(key_id, digest) for digest in hashes])
        session_id = next((value.decode() for value in reversed(found) if value), "")
    if not session_id:
        session_id = "p-" + secrets.token_hex(8)
    raw = await client.get(_state_key(team_id, session_id))
    state = json.loads(raw) if raw else {}
    earlier = state.get("hashes") or []
    shared = fingerprint.shared_blocks(hashes, earlier)
    repeated = ends[shared - 1] / ends[-1] if shared and ends[-1] else 0.0
    turn = int(state.get("turn") or 0) + 1
    pipe = client.pipeline(transaction=False)
    pipe.set(_state_key(team_id, session_id), json.dumps({"turn": turn, "hashes": hashes}), ex=SESSION_SECONDS)
    pipe.set(_prefix_key(key_id, hashes[-1]), session_id, ex=SESSION_SECONDS)
    await pipe.execute()
    return {"session_id": session_id, "session_turn": turn, "repeated_share": round(repeated, 4)}
