"""First-start seeding for `make run`: the admin account, the demo team and the demo model. Idempotent."""
import os
import secrets

from panel.accounts.services import admin_ensure, demo_team_ensure

ADMIN_USERNAME = "admin"


def bootstrap(*, on_progress=print):
    """Returns {"username", "password" (only when just generated), "from_env"}."""
    from_env = bool(os.environ.get("TOKENWISE_ADMIN_PASSWORD"))
    password = os.environ.get("TOKENWISE_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
    user, created = admin_ensure(username=ADMIN_USERNAME, password=password)
    demo_team_ensure(owner=user)
    from panel.core.demo_model import build_demo_model

    on_progress("checking the demo model (built once, then reused)")
    build_demo_model(None, on_progress=on_progress)
    return {"username": user.username, "password": password if created and not from_env else None,
            "from_env": from_env}
