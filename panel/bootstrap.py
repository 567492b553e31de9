"""First-start seeding for `make run`: the admin account, the demo team, the demo model and the starter model's
import (panel/registry/starter_model.py). Idempotent."""
import os
import secrets

from panel.accounts.services import admin_ensure, demo_team_ensure
from panel.registry.demo_model import DEMO_MODEL_DIRNAME, build_demo_model, default_demo_model_path
from panel.registry.models import RegisteredModel
from panel.registry.services import model_register
from panel.registry.starter_model import starter_model_ensure

ADMIN_USERNAME = "admin"


def bootstrap(*, on_progress=print):
    """Returns {"username", "password" (only when just generated), "from_env", "starter_job" (the starter model's
    import to watch, or None)}."""
    from_env = bool(os.environ.get("TOKENWISE_ADMIN_PASSWORD"))
    password = os.environ.get("TOKENWISE_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
    user, created = admin_ensure(username=ADMIN_USERNAME, password=password)
    team = demo_team_ensure(owner=user)
    on_progress("checking the demo model (built once, then reused)")
    build_demo_model(None, on_progress=on_progress)
    if not RegisteredModel.objects.filter(team=team, name=DEMO_MODEL_DIRNAME).exists():
        model_register(team=team, user=user, source=str(default_demo_model_path()), name=DEMO_MODEL_DIRNAME)
    line, starter_job = starter_model_ensure(team=team, user=user)
    on_progress(line)
    return {"username": user.username, "password": password if created and not from_env else None,
            "from_env": from_env, "starter_job": starter_job}
