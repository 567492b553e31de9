"""Per-key requests and tokens per minute, enforced atomically in Redis across every gateway process.

A fixed one-minute window: the admission's one script call (gateway/admission.py) checks both counters and counts
the request; the tokens a request used are added when it ends. A key over either limit gets 429 with Retry-After =
the seconds left in the window."""
import time

from panel.core.redis_client import async_redis


def window(now=None):
    now = time.time() if now is None else now
    minute = int(now // 60)
    return minute, 60 - int(now % 60)


def window_keys(key_id, minute):
    """(requests key, tokens key) of a key's window."""
    return f"tw:rl:{key_id}:{minute}:req", f"tw:rl:{key_id}:{minute}:tok"


async def count_tokens(key, tokens):
    if not key.tpm_limit or tokens <= 0:
        return
    minute, _ = window()
    token_key = window_keys(key.id, minute)[1]
    pipe = async_redis().pipeline()
    pipe.incrby(token_key, tokens)
    pipe.expire(token_key, 120)
    await pipe.execute()
