"""Which environment variables a channel may read its key from, and where it may send them.

A variable's value is the operator's key, while a channel's base URL is its team's choice: a team admin who could
name the variable and point the URL at their own server would receive the key. So the operator binds each variable
to the origins (scheme://host[:port]) its provider answers at, and optionally to teams, in
TOKENWISE_CREDENTIAL_ENV_BINDINGS; a variable with no binding is sent nowhere. The panel's own configuration
(SECRET_KEY, TOKENWISE_ENCRYPTION_KEYS, DATABASE_URL, REDIS_URL and every other variable its settings read) is
refused whatever the settings say."""
from django.conf import settings

from panel.env import DEFAULT_PORTS, names_read, url_origin

BINDINGS = "TOKENWISE_CREDENTIAL_ENV_BINDINGS"


def env_name_refusal(name):
    """Why a channel may not read its key from the variable `name`, whatever its base URL, in words; "" when it
    may (then `env_binding_refusal` says where it may be sent)."""
    if name in names_read() or name.startswith(("DJANGO_", "CELERY_")):
        return (f"{name} is part of the panel's own configuration, never an upstream key: put the provider's key "
                f"in a variable named {settings.CREDENTIAL_ENV_PREFIX}<NAME>.")
    if name in settings.CREDENTIAL_ENV_BINDINGS:
        return ""
    if name.startswith(settings.CREDENTIAL_ENV_PREFIX) or name in settings.CREDENTIAL_ENV_ALLOW:
        return (f"{name} is bound to no address, so the panel sends it nowhere: the operator must bind it to its "
                f"provider's origin in {BINDINGS} (for example {name}=https://api.provider.com) and restart "
                "the panel; or store a key of your own in the channel.")
    return (f"{name} is not a variable the operator allows for upstream keys: the operator binds each one to its "
            f"provider in {BINDINGS} (for example {settings.CREDENTIAL_ENV_PREFIX}TAOTOKEN=https://taotoken.net); "
            "or store a key of your own in the channel.")


def env_binding_refusal(channel):
    """Why `channel` may not send the variable it names to its base URL: ("credential_env" or "base_url", words),
    or None when it may."""
    name = channel.credential_env
    refusal = env_name_refusal(name)
    if refusal:
        return "credential_env", refusal
    binding = settings.CREDENTIAL_ENV_BINDINGS[name]
    if binding.teams and channel.team.slug not in binding.teams:
        return "credential_env", (f"{name} is the operator's key for other teams: ask the operator to add this team "
                                  f"({channel.team.slug}) to its binding in {BINDINGS}, or store a key of your own.")
    origin = url_origin(channel.base_url)
    if origin not in binding.origins:
        allowed = ", ".join(sorted(display_origin(each) for each in binding.origins))
        return "base_url", (f"the operator lets {name} be sent only to {allowed} ({BINDINGS}), not to "
                            f"{display_origin(origin) if origin else 'this address'}: point the base URL there, "
                            "or store a key of your own.")
    return None


def display_origin(origin):
    """An origin as people write it: without its scheme's default port."""
    scheme, _, address = origin.partition("://")
    host, _, port = address.rpartition(":")
    return f"{scheme}://{host}" if DEFAULT_PORTS[scheme] == int(port) else origin
