"""First-start seeding for `make run`: the admin account, the demo team and the demo model. Idempotent."""
import os
import secrets

from panel.accounts.services import admin_ensure, demo_team_ensure
from panel.registry.demo_model import DEMO_MODEL_DIRNAME, build_demo_model, default_demo_model_path
from panel.registry.models import RegisteredModel
from panel.registry.services import model_register

ADMIN_USERNAME = "admin"


def bootstrap(*, on_progress=print):
    """Returns {"username", "password" (only when just generated), "from_env"}."""
    from_env = bool(os.environ.get("TOKENWISE_ADMIN_PASSWORD"))
    password = os.environ.get("TOKENWISE_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
    user, created = admin_ensure(username=ADMIN_USERNAME, password=password)
    team = demo_team_ensure(owner=user)
    on_progress("checking the demo model (built once, then reused)")
    build_demo_model(None, on_progress=on_progress)
    if not RegisteredModel.objects.filter(team=team, name=DEMO_MODEL_DIRNAME).exists():
        model_register(team=team, user=user, source=str(default_demo_model_path()), name=DEMO_MODEL_DIRNAME)
    return {"username": user.username, "password": password if created and not from_env else None,
            "from_env": from_env}
