"""First-start seeding for `make run`: the admin account, the demo team, and the model it starts with: the starter
model's import (panel/registry/starter_model.py), or, where that is off or cannot be had, the demo model (trained
once into the data dir's cache: a few minutes of CPU, so only when it is needed). Idempotent."""
import os
import secrets

from panel.accounts.services import admin_ensure, demo_team_ensure
from panel.registry.demo_model import DEMO_MODEL_DIRNAME, build_demo_model, default_demo_model_path
from panel.registry.models import ModelState, RegisteredModel
from panel.registry.services import model_register
from panel.registry.starter_model import starter_model_ensure, starter_model_outcome

ADMIN_USERNAME = "admin"


def bootstrap(*, on_progress=print):
    """Returns {"username", "password" (only when just generated), "from_env", "starter_job" (the starter model's
    import to watch with `starter_settle`, or None)}."""
    from_env = bool(os.environ.get("TOKENWISE_ADMIN_PASSWORD"))
    password = os.environ.get("TOKENWISE_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
    user, created = admin_ensure(username=ADMIN_USERNAME, password=password)
    team = demo_team_ensure(owner=user)
    line, starter_job = starter_model_ensure(team=team, user=user)
    on_progress(line)
    starter_ready = team.models.filter(state=ModelState.READY).exclude(name=DEMO_MODEL_DIRNAME).exists()
    if starter_job is None and not starter_ready or team.models.filter(name=DEMO_MODEL_DIRNAME).exists():
        demo_model_ensure(team=team, user=user, on_progress=on_progress)  # the fallback, or kept up to date
    return {"username": user.username, "password": password if created and not from_env else None,
            "from_env": from_env, "starter_job": starter_job}


def demo_model_ensure(*, team, user, on_progress=print):
    """The demo model in the team: trained once into the data dir's cache (then copied), registered once."""
    on_progress("checking the demo model (built once, then reused)")
    build_demo_model(None, on_progress=on_progress)
    if not RegisteredModel.objects.filter(team=team, name=DEMO_MODEL_DIRNAME).exists():
        model_register(team=team, user=user, source=str(default_demo_model_path()), name=DEMO_MODEL_DIRNAME)


def starter_settle(job, *, on_progress=print):
    """Once the starter model's import has ended: say what the user has, and build the demo model when the starter
    model is not ready. None while it runs; else True when the starter model is ready."""
    line = starter_model_outcome(job)
    if line is None:
        return None
    on_progress(line)
    model = job.result_model
    if model is not None and model.state == ModelState.READY:
        return True
    demo_model_ensure(team=job.team, user=job.created_by, on_progress=on_progress)
    on_progress("the demo model is ready: new serving profiles use it")
    return False
