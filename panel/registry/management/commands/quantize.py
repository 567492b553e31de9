"""`manage.py quantize MODEL`: the same quantization path as the web form, run in this terminal, followed by the
quality report against the source model (also run here; --no-report skips it)."""
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from panel.jobs.services import job_cancel
from panel.registry.management.terminal import follow
from panel.registry.models import CalibrationSource, EvaluationJob, RegisteredModel
from panel.registry.quality import evaluation_execute, quality_verdict
from panel.registry.schemes import AUTOAWQ, DEFAULT_SCHEME, LLMC, SCHEMES
from panel.registry.services import calibration_store, calibration_text_check, quantization_execute, quantization_launch


class Command(BaseCommand):
    help = ("Quantize a registered model here (llm-compressor or AutoAWQ), with a progress bar, then measure it "
            "against its source (the jobs are recorded like any other).")

    def add_arguments(self, parser):
        parser.add_argument("model", help="the registered model's id or name")
        parser.add_argument("--team", help="the team's name, when the model name exists in several teams")
        parser.add_argument("--scheme", default=DEFAULT_SCHEME, choices=sorted(SCHEMES),
                            help=f"default {DEFAULT_SCHEME}")
        parser.add_argument("--backend", choices=[LLMC, AUTOAWQ], help="default: the scheme's (llm-compressor)")
        parser.add_argument("--group-size", type=int, choices=[0, 32, 64, 128, 256],
                            help="4-bit schemes; 0: one scale per output channel; default: the largest of 128, 64 "
                                 "and 32 that the model's shapes allow")
        parser.add_argument("--bits", type=int, default=4, choices=[2, 3, 4],
                            help="round-to-nearest only: 2 or 3 bits for comparison (vLLM cannot serve them)")
        parser.add_argument("--smoothquant", type=float, help="W8A8: SmoothQuant strength (0.05-0.95) first")
        parser.add_argument("--keep", action="append", default=[], help="mixed: a layer name pattern to keep")
        parser.add_argument("--keep-as", choices=["bf16", "fp8"], default="bf16")
        parser.add_argument("--no-report", action="store_true", help="skip the quality report after the job")
        parser.add_argument("--no-zero-point", action="store_true")
        parser.add_argument("--kernel", default="GEMM", choices=["GEMM", "GEMV"], help="AWQ kernel version")
        parser.add_argument("--calib", default="builtin", help="'builtin' or a UTF-8 text file of your domain")
        parser.add_argument("--max-calib-samples", type=int, default=32)
        parser.add_argument("--max-calib-seq-len", type=int, default=256)

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
        if options["smoothquant"] is not None and not 0.05 <= options["smoothquant"] <= 0.95:
            raise CommandError("--smoothquant must be between 0.05 and 0.95")
        try:
            job = quantization_launch(
                team=model.team, user=None, source=model, scheme=options["scheme"], backend=options["backend"],
                smoothquant=options["smoothquant"], keep_patterns=options["keep"], keep_as=options["keep_as"],
                q_group_size=options["group_size"], w_bit=options["bits"],
                zero_point=not options["no_zero_point"], version=options["kernel"], calibration=calibration,
                calibration_file=calibration_file, calibration_name=calibration_name,
                max_calib_samples=options["max_calib_samples"], max_calib_seq_len=options["max_calib_seq_len"],
                enqueue=False)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        self.stdout.write(f"quantization job #{job.pk} ({job.scheme_label}, {job.backend}): {model.name} -> "
                          f"{job.output_dir}")
        job = follow(job, quantization_execute)
        result = job.result
        self.stdout.write(self.style.SUCCESS(
            f"done in {result.get('seconds', 0):.0f} s: {result.get('size_before_bytes', 0) / 2**20:.1f} MiB -> "
            f"{result.get('size_after_bytes', 0) / 2**20:.1f} MiB, registered as {result.get('model_name')}"))
        report_id = result.get("quality_report")
        if result.get("quality_report_refused"):
            self.stdout.write(f"no quality report: {result['quality_report_refused']}")
        if report_id and options["no_report"]:
            job_cancel(EvaluationJob.objects.get(pk=report_id))  # still pending: nobody else would run it
            self.stdout.write(f"quality report #{report_id} skipped (--no-report)")
        if report_id and not options["no_report"]:
            self.stdout.write(f"quality report #{report_id}: measuring it and {model.name} as vLLM serves them")
            report = follow(EvaluationJob.objects.get(pk=report_id), evaluation_execute)
            for measured in report.result.get("models", []):
                kinds = measured.get("tasks") or {}
                right = sum(pair[0] for kind, pair in kinds.items() if kind != "json")
                total = sum(pair[1] for kind, pair in kinds.items() if kind != "json")
                json_right, json_total = kinds.get("json", [0, 0])
                self.stdout.write(f"  {measured['path']}: perplexity {measured['perplexity']:.2f}, JSON answers "
                                  f"{json_right} of {json_total}, other tasks {right} of {total}")
            verdict = quality_verdict(RegisteredModel.objects.get(pk=result["model_id"]))
            if verdict is not None:
                self.stdout.write(self.style.WARNING(verdict.words) if verdict.flags else verdict.words)

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
