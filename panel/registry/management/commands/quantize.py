"""`manage.py quantize MODEL`: the same quantization path as the web form, run in this terminal."""
import sys
import threading

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from panel.jobs.services import job_cancel
from panel.registry.models import CalibrationSource, QuantizationJob, RegisteredModel
from panel.registry.services import calibration_store, calibration_text_check, quantization_execute, quantization_launch

BAR_WIDTH = 40


class Command(BaseCommand):
    help = "Quantize a registered model with AWQ here, with a progress bar (the job is recorded like any other)."

    def add_arguments(self, parser):
        parser.add_argument("model", help="the registered model's id or name")
        parser.add_argument("--team", help="the team's name, when the model name exists in several teams")
        parser.add_argument("--group-size", type=int, default=128, choices=[64, 128, 256])
        parser.add_argument("--no-zero-point", action="store_true")
        parser.add_argument("--kernel", default="GEMM", choices=["GEMM", "GEMV"], help="AWQ kernel version")
        parser.add_argument("--calib", default="builtin", help="'builtin' or a UTF-8 text file of your domain")
        parser.add_argument("--max-calib-samples", type=int, default=128)
        parser.add_argument("--max-calib-seq-len", type=int, default=512)

    def handle(self, *args, **options):
        model = self.find_model(options["model"], options["team"])
        calibration, calibration_file, calibration_name = CalibrationSource.BUILTIN, "", ""
        if options["calib"] != "builtin":
            try:
                with open(options["calib"], "rb") as handle:
                    data = handle.read()
                calibration_text_check(data)
            except OSError as error:
                raise CommandError(f"cannot read {options['calib']}: {error.strerror}") from None
            except ValidationError as error:
                raise CommandError(" ".join(error.messages)) from None
            calibration, calibration_name = CalibrationSource.FILE, options["calib"]
            calibration_file = calibration_store(team=model.team, data=data)
        if not 8 <= options["max_calib_samples"] <= 4096 or not 64 <= options["max_calib_seq_len"] <= 4096:
            raise CommandError("--max-calib-samples must be 8-4096 and --max-calib-seq-len 64-4096")
        try:
            job = quantization_launch(
                team=model.team, user=None, source=model, q_group_size=options["group_size"],
                zero_point=not options["no_zero_point"], version=options["kernel"], calibration=calibration,
                calibration_file=calibration_file, calibration_name=calibration_name,
                max_calib_samples=options["max_calib_samples"], max_calib_seq_len=options["max_calib_seq_len"],
                enqueue=False)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        self.stdout.write(f"quantization job #{job.pk}: {model.name} -> {job.output_dir}")
        worker = threading.Thread(target=quantization_execute, kwargs={"job_id": job.pk, "worker": "terminal"})
        worker.start()
        try:
            while worker.is_alive():
                self.draw(QuantizationJob.objects.get(pk=job.pk))
                worker.join(timeout=0.5)
        except KeyboardInterrupt:
            sys.stdout.write("\ncancelling...\n")
            job_cancel(job)
            worker.join()
        job.refresh_from_db()
        self.draw(job)
        sys.stdout.write("\n")
        if job.state != "succeeded":
            raise CommandError(f"job #{job.pk} {job.state}: {job.failure_kind} {job.failure_reason}".strip())
        result = job.result
        self.stdout.write(self.style.SUCCESS(
            f"done in {result.get('seconds', 0):.0f} s: {result.get('size_before_bytes', 0) / 2**20:.1f} MiB -> "
            f"{result.get('size_after_bytes', 0) / 2**20:.1f} MiB, registered as {result.get('model_name')}"))

    def find_model(self, key, team_name):
        models = RegisteredModel.objects.select_related("team")
        if team_name:
            models = models.filter(team__name=team_name)
        found = list(models.filter(pk=int(key))) if key.isdigit() else list(models.filter(name=key))
        if not found:
            raise CommandError(f"no registered model {key!r}" + (f" in team {team_name!r}" if team_name else ""))
        if len(found) > 1:
            raise CommandError(f"{len(found)} teams have a model named {key!r}: pass --team")
        return found[0]

    def draw(self, job):
        filled = int(BAR_WIDTH * job.progress / 100)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        sys.stdout.write(f"\r[{bar}] {job.progress:3d}% {job.phase[:50]:<50}")
        sys.stdout.flush()
