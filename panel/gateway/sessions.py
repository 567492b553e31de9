"""Agent sessions: which session a request belongs to, its turn in it, and how much of its prompt repeats the
previous turn's, so the Agents dashboard can show how an agent's context grows and what caching saved.

A request belongs to a session by, in this order: its `x-session-id` header, or the `session-id` header Codex sends
(its conversation's id, the same on every turn); an Anthropic body's
`metadata.user_id` (stored as its keyed hash, never as sent); else prefix chaining, where a request whose prompt
extends an earlier prompt of the same key (the earlier prompt's blocks are its first blocks) joins that prompt's
session, and any other starts a new one.
Only keyed hashes of the prompt's prefix blocks (gateway/fingerprint.py) are kept, in Redis for SESSION_SECONDS;
never the text. Redis is asked in the admission's one call (gateway/admission.py); if it cannot be reached the
request is served without session fields."""
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

from django.conf import settings

from panel.gateway import fingerprint

SESSION_SECONDS = 2 * 3600  # an agent idle this long starts a new session
SESSION_ID_CHARS = 64
SESSION_HEADER = "x-session-id"
CODEX_SESSION_HEADER = "session-id"  # OpenAI's Codex CLI (0.171) names its conversation in it


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


def user_session_id(user_id):
    """The session id stored for an Anthropic `metadata.user_id`: its keyed hash ("u-" and 32 hex digits). A user
    id can name a person or an account, so it is never stored; the same id still gives the same session."""
    key = hashlib.sha256(b"tokenwise-session-user:" + settings.SECRET_KEY.encode()).digest()
    return "u-" + hmac.new(key, user_id.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:32]


def declared_session(body, headers):
    """The session id the client names (the header as sent, else metadata.user_id's keyed hash), or ""."""
    named = _header(headers, SESSION_HEADER) or _header(headers, CODEX_SESSION_HEADER)
    if named:
        return _clean_id(named)
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    return user_session_id(user_id) if isinstance(user_id, str) and user_id else ""


@dataclass(frozen=True)
class SessionAsk:
    """What finding a request's session needs (gateway/admission.py asks Redis for it): the id the client named
    ("" for none), the id a new session gets, and the prompt's prefix-block hashes and their ends."""

    declared: str
    new_id: str
    hashes: list
    ends: list


def session_ask(*, body, headers):
    """The SessionAsk of a request, or None when it has no prompt to hash."""
    hashes, ends = fingerprint.prefix_hashes(body)
    if not hashes:
        return None
    return SessionAsk(declared_session(body, headers), "p-" + secrets.token_hex(8), hashes, ends)


def state_prefix(team_id):
    """The start of the key of a session's state (the last turn and its hashes): the session id follows."""
    return f"tw:session:{team_id}:"


def prefix_keys(key_id, hashes):
    """The keys from a prompt's prefix hashes to the session that sent that prompt, the shortest prompt first."""
    return [f"tw:prefix:{key_id}:{digest}" for digest in hashes]


def session_fields(ask, *, session_id, turn, previous):
    """{"session_id", "session_turn", "repeated_share"} of a request given its session, its turn in it and the
    state the previous turn left (b"" for none)."""
    try:
        earlier = (json.loads(previous).get("hashes") or []) if previous else []
    except (ValueError, AttributeError):  # a state this version cannot read: the turn shares nothing
        earlier = []
    shared = fingerprint.shared_blocks(ask.hashes, earlier)
    ends = ask.ends
    repeated = ends[shared - 1] / ends[-1] if shared and ends[-1] else 0.0
    return {"session_id": session_id, "session_turn": turn, "repeated_share": round(repeated, 4)}
