"""`manage.py undeploy DEPLOYMENT`: stop a deployment (SIGTERM, then SIGKILL after the grace period)."""
from django.core.management.base import BaseCommand, CommandError

from panel.serving.management.commands.deploy import wait_for
from panel.serving.models import Deployment, DeploymentState
from panel.serving.services import deployment_stop


class Command(BaseCommand):
    help = "Stop a deployment by its id."

    def add_arguments(self, parser):
        parser.add_argument("deployment", type=int)
        parser.add_argument("--wait", type=int, default=60, metavar="SECONDS",
                            help="wait up to SECONDS for it to stop (0: do not wait)")

    def handle(self, *args, **options):
        deployment = Deployment.objects.filter(pk=options["deployment"]).first()
        if deployment is None:
            raise CommandError(f"no deployment #{options['deployment']}")
        if not deployment_stop(deployment=deployment, reason="stopped from the terminal"):
            raise CommandError(f"deployment #{deployment.pk} is already {deployment.state}")
        if options["wait"]:
            deployment = wait_for(deployment, {DeploymentState.STOPPED, DeploymentState.FAILED}, options["wait"])
        self.stdout.write(self.style.SUCCESS(f"deployment #{deployment.pk} is {deployment.state}"))
