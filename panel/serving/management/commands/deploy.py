"""`manage.py deploy PROFILE`: launch a serving profile on a worker, as the Launch button does."""
import time

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from panel.hosts.models import WorkerHost
from panel.serving.models import Deployment, DeploymentState, ScalePolicy, ServingProfile
from panel.serving.services import deployment_launch, deployment_warnings


class Command(BaseCommand):
    help = "Launch a serving profile as a deployment on a GPU worker (picked by free memory unless --host)."

    def add_arguments(self, parser):
        parser.add_argument("profile", help="the profile's id or name")
        parser.add_argument("--team", help="the team's name, when several teams have a profile of that name")
        parser.add_argument("--host", help="the worker host to run on (its TOKENWISE_HOST_NAME)")
        parser.add_argument("--replicas", type=int, default=1, help="engines serving the profile, placed over the "
                            "GPU workers with room (all on --host when given)")
        parser.add_argument("--max-replicas", type=int, metavar="N",
                            help="scale on queue between --replicas and N (the scale policy's defaults; change them "
                                 "on the deployment's page or through the API)")
        parser.add_argument("--restart-on-crash", action="store_true")
        parser.add_argument("--wait", type=int, default=0, metavar="SECONDS",
                            help="wait up to SECONDS for the deployment to be ready")

    def handle(self, *args, **options):
        profile = find_one(ServingProfile.objects.select_related("model", "team"), options["profile"],
                           options["team"], "serving profile")
        host = None
        if options["host"]:
            host = WorkerHost.objects.filter(kind="gpu", host=options["host"]).first()
            if host is None:
                raise CommandError(f"no GPU worker on host {options['host']!r}")
        try:
            deployment = deployment_launch(team=profile.team, user=None, profile=profile, host=host,
                                           replicas=options["replicas"], max_replicas=options["max_replicas"],
                                           restart_on_crash=options["restart_on_crash"])
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        replicas = deployment.replicas()
        self.stdout.write(f"deployment #{deployment.pk} of {profile.name} queued on "
                          + ", ".join(f"{replica.host.host} (replica {replica.replica_number})" if len(replicas) > 1
                                      else replica.host.host for replica in replicas))
        policy = ScalePolicy.objects.filter(deployment=deployment).first()
        if policy is not None:
            self.stdout.write(f"scales on queue between {policy.min_replicas} and {policy.max_replicas} replicas")
        for warning in deployment_warnings(deployment):
            self.stdout.write(self.style.WARNING(f"warning: {warning}"))
        if options["wait"]:
            deadline = time.monotonic() + options["wait"]
            for replica in replicas:
                replica = wait_for(replica, {DeploymentState.READY, DeploymentState.FAILED, DeploymentState.STOPPED},
                                   max(1, deadline - time.monotonic()))
                if replica.state != DeploymentState.READY:
                    raise CommandError(f"deployment #{replica.pk} is {replica.state}: {replica.failure_kind} "
                                       f"{replica.failure_reason}".strip())
                self.stdout.write(self.style.SUCCESS(f"ready: {replica.served_model_name} at {replica.base_url}"))


def find_one(queryset, key, team_name, what):
    if team_name:
        queryset = queryset.filter(team__name=team_name)
    found = list(queryset.filter(pk=int(key))) if key.isdigit() else list(queryset.filter(name=key))
    if not found:
        raise CommandError(f"no {what} {key!r}")
    if len(found) > 1:
        raise CommandError(f"{len(found)} teams have a {what} named {key!r}: pass --team")
    return found[0]


def wait_for(deployment, states, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        deployment = Deployment.objects.get(pk=deployment.pk)
        if deployment.state in states:
            return deployment
        time.sleep(0.5)
    raise CommandError(f"deployment #{deployment.pk} is still {deployment.state} after {seconds} s")
