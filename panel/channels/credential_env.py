"""Which environment variables a channel may read its key from.

A channel's key is sent as `Bearer` to a base URL its team chooses, so the variable must be one the operator meant
for upstream keys: a name starting with TOKENWISE_UPSTREAM_, or one listed in TOKENWISE_CREDENTIAL_ENV_ALLOW. The
panel's own configuration (SECRET_KEY, TOKENWISE_ENCRYPTION_KEYS, DATABASE_URL, REDIS_URL and every other variable
its settings read) is refused even when listed."""
from django.conf import settings

from panel.env import names_read


def env_name_refusal(name):
    """Why a channel may not read its key from the variable `name`, in words; "" when it may."""
    if name in names_read() or name.startswith(("DJANGO_", "CELERY_")):
        return (f"{name} is part of the panel's own configuration, never an upstream key: put the provider's key "
                f"in a variable named {settings.CREDENTIAL_ENV_PREFIX}<NAME>.")
    if name.startswith(settings.CREDENTIAL_ENV_PREFIX) or name in settings.CREDENTIAL_ENV_ALLOW:
        return ""
    return (f"{name} is not a variable the operator allows for upstream keys: use a name starting with "
            f"{settings.CREDENTIAL_ENV_PREFIX} (for example {settings.CREDENTIAL_ENV_PREFIX}TAOTOKEN), or ask the "
            "operator to add it to TOKENWISE_CREDENTIAL_ENV_ALLOW.")
