"""What a config ladder or a sweep makes for its steps is the job's own: each step's serving profile is marked
(StepProfile), and with it the deployment, the local channel `local-<profile>` and the route named after the
served model that the deployment brings up. They are hidden from the Channels page and the benchmark targets, and
removed with the job."""
from django.core.exceptions import ValidationError
from django.db import transaction

from panel.channels.models import Channel, Route
from panel.channels.routing import routing_changed
from panel.serving.models import Deployment, ServingProfile


def job_remove(job):
    """Remove a finished ladder or sweep with everything it made: its runs, its steps' profiles and deployments,
    their channels and routes (a route only when no channel of the team's own is on it). ValidationError while
    the job or one of its deployments is still active."""
    if not job.is_final:
        raise ValidationError(f"{job} is {job.get_state_display().lower()}: cancel it first, or wait until it ends.")
    profiles = ServingProfile.objects.filter(benchmark_step__in=job.step_profiles.all())
    deployments = Deployment.objects.filter(profile__in=profiles)
    active = [str(deployment) for deployment in deployments if not deployment.is_final]
    if active:
        raise ValidationError(f"Its deployment {', '.join(active)} is still running; it stops within a minute.")
    with transaction.atomic():
        channels = Channel.objects.filter(team=job.team, deployment__in=deployments)
        names = list(profiles.values_list("served_model_name", flat=True))
        routes = Route.objects.filter(team=job.team, model_name__in=names).exclude(
            routechannel__channel__in=Channel.objects.filter(team=job.team).exclude(pk__in=channels))
        routes.delete()
        channels.delete()
        job.runs.all().delete()
        deployments.delete()
        profiles.delete()
        job.delete()
    routing_changed(job.team_id)
