"""How long a ladder or sweep will take, before it starts and while it runs: steps × (engine start + the measured
requests), with both figures measured on this host from earlier ladder and sweep steps, or stated defaults when
there are none yet."""
import math

from django.utils import timezone

from panel.benchmarks.models import BenchmarkRun
from panel.jobs.models import JobState
from panel.serving.models import Deployment

DEFAULT_ENGINE_START_SECONDS = 90.0  # a small model on a CPU host (DESIGN.md: about a minute to "ready")
DEFAULT_SECONDS_PER_REQUEST = 1.0  # one request of the default workload at the ladder's concurrency
HISTORY = 20  # the latest steps looked at
STOP_SECONDS = 5.0  # stopping an engine between steps


def host_figures(host):
    """{"engine_start": s, "per_request": s, "measured": bool, "samples": n} for `host` (None: every host)."""
    deployments = Deployment.objects.filter(profile__benchmark_step__isnull=False, ready_at__isnull=False,
                                            started_at__isnull=False)
    runs = BenchmarkRun.objects.filter(state=JobState.SUCCEEDED, deployment__profile__benchmark_step__isnull=False,
                                       started_at__isnull=False, finished_at__isnull=False)
    if host is not None:
        deployments, runs = deployments.filter(host=host), runs.filter(deployment__host=host)
    starts = [(d.ready_at - d.started_at).total_seconds() for d in deployments.order_by("-ready_at")[:HISTORY]
              if d.started_at < d.ready_at]  # a restarted one's started_at is the restart's: not a start-up time
    per_request = [(r.finished_at - r.started_at).total_seconds() / max(r.requests + r.warmup_requests, 1)
                   for r in runs.order_by("-finished_at")[:HISTORY]]
    return {"engine_start": sum(starts) / len(starts) if starts else DEFAULT_ENGINE_START_SECONDS,
            "per_request": sum(per_request) / len(per_request) if per_request else DEFAULT_SECONDS_PER_REQUEST,
            "measured": bool(starts and per_request), "samples": min(len(starts), len(per_request))}


def step_seconds(figures, *, requests, warmup, repeats):
    return figures["engine_start"] + STOP_SECONDS + repeats * (requests + warmup) * figures["per_request"]


def job_estimate(figures, *, steps, requests, warmup, repeats):
    """Seconds for `steps` steps."""
    return steps * step_seconds(figures, requests=requests, warmup=warmup, repeats=repeats)


def duration_words(seconds):
    if seconds is None:
        return ""
    minutes = math.ceil(seconds / 60)
    if minutes < 60:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60:02d} min"


def time_left(job, *, steps_total, steps_done):
    """Seconds left for a running ladder or sweep: the steps still to go at the pace of those already done (or the
    host's figures before the first one ends). None when it is not running."""
    if not job.is_active:
        return None
    requests, warmup, repeats = job.requests, job.warmup_requests, getattr(job, "repeats", 1) or 1
    per_step = step_seconds(host_figures(job.host), requests=requests, warmup=warmup, repeats=repeats)
    elapsed = (timezone.now() - job.started_at).total_seconds() if job.started_at else 0.0
    if steps_done:
        per_step = elapsed / steps_done
        return max(per_step * (steps_total - steps_done), 0.0)
    return max(per_step * steps_total - elapsed, per_step * 0.1)
