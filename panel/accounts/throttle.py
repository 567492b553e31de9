"""Sign-in throttling against password guessing, in the authentication backend (`backends.py`), so the panel's
sign-in page and the Django admin's are both covered. Counters live in the shared cache (Redis) for
SIGNIN_WINDOW_SECONDS:

- one username from one address: SIGNIN_MAX_FAILURES failures lock that pair, so a stranger guessing from elsewhere
  does not lock the user out of their own address;
- one username from anywhere: a softer limit (ten times as many), against guessing spread over many addresses;
- one address, any usernames: four times as many, against one client trying every name."""
import hashlib

from django.conf import settings
from django.core.cache import cache

SOFT_USER_FACTOR = 10
ADDRESS_FACTOR = 4


def _limits(username, address):
    user = hashlib.sha256((username or "").strip().lower().encode()).hexdigest()[:32]
    most = settings.SIGNIN_MAX_FAILURES
    return {f"signin:pair:{user}:{address or '?'}": most, f"signin:user:{user}": most * SOFT_USER_FACTOR,
            f"signin:addr:{address or '?'}": most * ADDRESS_FACTOR}


def signin_blocked(username, address):
    limits = _limits(username, address)
    counts = cache.get_many(list(limits))
    return any(count >= limits[key] for key, count in counts.items())


def signin_failed(username, address):
    for key in _limits(username, address):
        if cache.add(key, 1, timeout=settings.SIGNIN_WINDOW_SECONDS):
            continue
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, timeout=settings.SIGNIN_WINDOW_SECONDS)


def signin_succeeded(username, address):
    cache.delete(next(iter(_limits(username, address))))
