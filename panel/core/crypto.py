"""Upstream credentials at rest: MultiFernet over TOKENWISE_ENCRYPTION_KEYS (comma-separated Fernet keys; the first
one encrypts, every one decrypts, so a new key goes first and an old one stays until `credentials_rotate` has run).

Never SECRET_KEY: rotating the session secret must not lose every stored key, and a leaked SECRET_KEY must not
decrypt them. A missing or malformed variable is an EnvError naming it; a token that no configured key opens is a
CredentialError: the caller reports the channel as misconfigured and never sends the ciphertext anywhere."""
import threading

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from panel.env import EnvError, envlist

ENV_NAME = "TOKENWISE_ENCRYPTION_KEYS"
GENERATE_HINT = ("generate one with: python -c 'from cryptography.fernet import Fernet; "
                 "print(Fernet.generate_key().decode())'")


class CredentialError(Exception):
    """An upstream credential cannot be produced. The message says why, in words, and never holds the key."""


_lock = threading.Lock()
_cached = (None, None)  # (the variable's raw value, its MultiFernet)


def keyring():
    """The MultiFernet for the current value of TOKENWISE_ENCRYPTION_KEYS (rebuilt when the value changes)."""
    global _cached
    keys = envlist(ENV_NAME, [])
    raw = ",".join(keys)
    cached_raw, cached = _cached
    if cached is not None and cached_raw == raw:
        return cached
    if not keys:
        raise EnvError(f"{ENV_NAME} is not set: it holds the Fernet key(s) that encrypt upstream credentials "
                       f"(make run generates one into data/secrets/; {GENERATE_HINT})")
    fernets = []
    for number, key in enumerate(keys, start=1):
        try:
            fernets.append(Fernet(key.encode("ascii")))
        except (ValueError, UnicodeEncodeError):
            # The message must not repeat the key: it is a secret even when malformed.
            raise EnvError(f"{ENV_NAME}: key {number} of {len(keys)} is not a Fernet key (32 bytes in url-safe "
                           f"base64, 44 characters); {GENERATE_HINT}") from None
    ring = MultiFernet(fernets)
    with _lock:
        _cached = (raw, ring)
    return ring


def encrypt(text):
    """The Fernet token (str) for `text`, encrypted with the first configured key."""
    return keyring().encrypt(text.encode("utf-8")).decode("ascii")


def decrypt(token):
    """The plaintext of a token from `encrypt`. CredentialError when no configured key opens it."""
    ring = keyring()
    try:
        return ring.decrypt(token.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeError, AttributeError):
        raise CredentialError(f"the stored key cannot be decrypted with any key in {ENV_NAME} (it was encrypted "
                              "with a key that is no longer configured, or the stored value is damaged): "
                              "enter the key again") from None


def rotate(token):
    """The same secret re-encrypted with the first configured key. CredentialError when no key opens it."""
    ring = keyring()
    try:
        return ring.rotate(token.encode("ascii")).decode("ascii")
    except (InvalidToken, UnicodeError, AttributeError):
        raise CredentialError(f"the stored key cannot be decrypted with any key in {ENV_NAME}, so it cannot be "
                              "re-encrypted: enter the key again") from None


def encryption_keys_check(app_configs=None, **kwargs):
    """System check: stored upstream keys are unusable until TOKENWISE_ENCRYPTION_KEYS is right."""
    from django.core import checks

    try:
        keyring()
    except EnvError as error:
        return [checks.Warning(str(error), hint="Channels with a stored key are reported as misconfigured.",
                               id="channels.W001")]
    return []


def encryption_problem():
    """The configuration error in words, or "" when the keys are usable (for a banner on the pages)."""
    try:
        keyring()
    except EnvError as error:
        return str(error)
    return ""
