"""manage.py make_demo_model [PATH] [--force [--steps N]]: build the tiny demo model (panel/registry/demo_model.py)."""
from django.core.management.base import BaseCommand, CommandError

from panel.registry.demo_model import DemoModelError, build_demo_model, default_demo_model_path


class Command(BaseCommand):
    help = "Build the tiny Qwen2 demo model (random weights, stdlib-trained tokenizer) in the engine venv."

    def add_arguments(self, parser):
        parser.add_argument("path", nargs="?", default=None,
                            help=f"output folder (default: {default_demo_model_path()})")
        parser.add_argument("--force", action="store_true", help="rebuild even if a complete model is there")
        parser.add_argument("--steps", type=int, default=None,
                            help="with --force: train for this many optimizer steps (default 240; fewer is quicker "
                                 "and the model weaker)")

    def handle(self, *args, path=None, force=False, steps=None, **options):
        if steps is not None and steps < 1:
            raise CommandError("--steps must be a positive number of training steps")
        try:
            result = build_demo_model(path, force=force, steps=steps, on_progress=self.stdout.write)
        except DemoModelError as error:
            raise CommandError(str(error)) from error
        self.stdout.write(self.style.SUCCESS(summary(result)))
        return None


def summary(result):
    """One line for a person: where the model is, how big, and whether it was built or already there."""
    size_mb = result["size_bytes"] / 1e6
    parameters_m = result["parameters"] / 1e6
    how = "already built" if result.get("reused") else f"built in {result['seconds']:.1f} s"
    return f"Demo model at {result['path']}: {parameters_m:.1f}M parameters, {size_mb:.1f} MB, {how}."
