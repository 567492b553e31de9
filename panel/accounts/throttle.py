"""Sign-in throttling against password guessing: after SIGNIN_MAX_FAILURES failed attempts for one username (or
from one address) within SIGNIN_WINDOW_SECONDS, sign-in is refused for the rest of the window, even with the
right password. Counters live in the shared cache (Redis), so every web process sees them."""
import hashlib

from django.conf import settings
from django.core.cache import cache


def _keys(username, address):
    user = hashlib.sha256((username or "").strip().lower().encode()).hexdigest()[:32]
    return [f"signin:user:{user}", f"signin:addr:{address or '?'}"]


def signin_blocked(username, address):
    counts = cache.get_many(_keys(username, address))
    return any(count >= settings.SIGNIN_MAX_FAILURES for count in counts.values())


def signin_failed(username, address):
    for key in _keys(username, address):
        if cache.add(key, 1, timeout=settings.SIGNIN_WINDOW_SECONDS):
            continue
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, timeout=settings.SIGNIN_WINDOW_SECONDS)


def signin_succeeded(username, address):
    cache.delete(_keys(username, address)[0])
