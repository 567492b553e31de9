"""Per-key requests and tokens per minute, enforced atomically in Redis across every gateway process.

A fixed one-minute window: the admission's one script call (gateway/admission.py) checks both counters, counts the
request and holds its most in tokens; when it ends, what it used replaces what it held. A key over either limit gets 429
with Retry-After = the seconds left in the window."""
import time

from panel.core.redis_client import async_redis


def window(now=None):
    now = time.time() if now is None else now
    minute = int(now // 60)
    return minute, 60 - int(now % 60)


def window_keys(key_id, minute):
    """(requests key, tokens key) of a key's window."""
    return f"tw:rl:{key_id}:{minute}:req", f"tw:rl:{key_id}:{minute}:tok"


async def count_tokens(key, tokens, reservation=None):
    """Count a finished request's tokens in its key's window: in the window that holds its most (admission), the
    difference between what it used and what it held (what it did not use back to its advance, when it took its hold
    from one: gateway/advances.py); without a hold, in the current window."""
    commands = token_commands(key, tokens, reservation)
    if commands:
        pipe = async_redis().pipeline()
        for command in commands:
            pipe.execute_command(*command[1:])
        await pipe.execute()


def token_commands(key, tokens, reservation=None):
    """`count_tokens`'s Redis commands, as (None, command, *arguments) for redis_client.together; none when the
    window does not move."""
    if reservation is not None and reservation.window_key:
        token_key, change = reservation.window_key, tokens - reservation.window_tokens
        pool = reservation.pool
        if pool is not None and change <= 0 and pool.window_back(reservation.window_minute, -change):
            return []
    elif key.tpm_limit and tokens > 0:
        token_key, change = window_keys(key.id, window()[0])[1], tokens
    else:
        return []
    if change == 0:
        return []
    return [(None, "INCRBY", token_key, change), (None, "EXPIRE", token_key, 120)]
