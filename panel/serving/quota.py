"""A team's GPU quota (`Team.gpu_quota`, set by an owner on the Members page): the most GPUs its deployments may
hold at once, counted as placement counts them (serving/placement.py): a deployment holds the GPUs it was given, or,
until it has them, tensor × pipeline parallel of its profile; a deployment on a CPU host holds none. Ladders and
sweeps launch their steps through `deployment_launch` and count the same way."""
from django.core.exceptions import ValidationError

from panel.accounts.models import Team
from panel.serving.models import ACTIVE_DEPLOYMENT_STATES, Deployment


def gpus_held(team):
    """The GPUs `team`'s queued and running deployments hold (or take when they start)."""
    held = 0
    active = Deployment.objects.filter(team=team, state__in=list(ACTIVE_DEPLOYMENT_STATES)).select_related(
        "host", "profile")
    for deployment in active:
        if deployment.host is not None and deployment.host.gpus:
            held += len(deployment.gpu_indices) if deployment.gpu_indices else (
                deployment.profile.tensor_parallel_size * deployment.profile.pipeline_parallel_size)
    return held


def gpu_quota_check(*, team, profile, hosts):
    """Call inside the transaction that inserts the deployment's rows, before the inserts: ValidationError when the
    replicas placed on `hosts` would take the team past its GPU quota. The team's row is locked until that
    transaction ends (PostgreSQL), so two launches at once cannot both take the last GPUs."""
    quota = Team.objects.select_for_update().values_list("gpu_quota", flat=True).get(pk=team.pk)
    if quota is None:
        return
    per_replica = profile.tensor_parallel_size * profile.pipeline_parallel_size
    asked = sum(per_replica for host in hosts if host.gpus)
    if not asked:
        return
    held = gpus_held(team)
    if held + asked > quota:
        raise ValidationError(
            f"This launch needs {asked} GPU{'s' if asked != 1 else ''}, and your team's deployments already hold "
            f"{held} of its quota of {quota}: stop a deployment or ask for fewer replicas, or ask an owner of the "
            "team to raise its GPU quota (Members page).")
