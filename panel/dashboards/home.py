"""The overview page's answer to "how are we doing": this calendar month's spend, requests, local share and savings
(the Cost tab's figures over the month), the live deployments, and what is failing (channels, jobs)."""
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django.urls import reverse

from panel.channels.models import listed_channels
from panel.core.money import money
from panel.dashboards.cost import cost_summary
from panel.dashboards.ledger import deployment_ledger
from panel.dashboards.selectors import DashboardQuery, usage_totals
from panel.jobs.services import job_models
from panel.serving.models import ACTIVE_DEPLOYMENT_STATES, Deployment

FAILED_JOBS_DAYS = 7
FAILED_JOBS_SHOWN = 5
# The page of each kind of job; a kind not listed here links to its model's page (a model check).
JOB_PAGES = {"registry.quantizationjob": "quantization_job", "registry.evaluationjob": "evaluation_job",
             "registry.ggufimportjob": "gguf_import_job", "serving.deployment": "deployment_detail",
             "benchmarks.benchmarkrun": "benchmark_run", "benchmarks.ladder": "benchmark_ladder",
             "benchmarks.sweep": "benchmark_sweep", "hosts.enginecheck": "engine_check",
             "dashboards.statementimport": "statement_import_detail", "evaluations.evalrun": "eval_run_detail"}
JOB_NAMES = {"registry.quantizationjob": "Quantization", "registry.evaluationjob": "Quality report",
             "registry.ggufimportjob": "GGUF import", "registry.modelcheckjob": "Model check",
             "serving.deployment": "Deployment", "benchmarks.benchmarkrun": "Benchmark",
             "benchmarks.ladder": "Config ladder", "benchmarks.sweep": "Sweep", "hosts.enginecheck": "Engine check",
             "dashboards.statementimport": "Statement import", "evaluations.evalrun": "Evaluation run"}


@dataclass(frozen=True)
class MonthQuery(DashboardQuery):
    """The calendar month so far (UTC), read from the day rollups like the 30-day range."""

    month_start: float = 0

    @property
    def start(self):
        return int(self.month_start)


@dataclass
class Month:
    name: str  # "December 2026"
    requests: int
    errors: int
    spend: float | None  # None: a local deployment's host has no GPU price
    local_share: float | None  # local tokens / all tokens
    savings: float | None
    savings_share: float | None
    baseline_name: str
    missing_prices: list

    @property
    def dearer(self):
        """Local serving cost more than the cloud would have: the savings are negative."""
        return self.savings is not None and self.savings < 0

    @property
    def savings_shown(self):
        return None if self.savings is None else money(abs(self.savings))

    @property
    def error_share(self):
        return self.errors / self.requests if self.requests else None


@dataclass
class Attention:
    """One thing that is failing, in words, with where to fix it."""

    what: str
    why: str
    link: str


@dataclass
class Overview:
    month: Month
    deployments: list
    attention: list = field(default_factory=list)


def month_start(now):
    moment = datetime.fromtimestamp(now, tz=dt_timezone.utc)
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def month_figures(team, now):
    began = month_start(now)
    query = MonthQuery(team=team, range="30d", now=now, month_start=began.timestamp())
    totals = usage_totals(query, columns=("requests", "errors", "refused"))
    summary = cost_summary(query)
    tokens = summary.local_tokens + summary.cloud_tokens
    return Month(name=began.strftime("%B %Y"), requests=totals["requests"],
                 errors=totals["errors"] - totals["refused"],  # the clients' own 4xx are not failures
                 spend=money(summary.actual), local_share=summary.local_tokens / tokens if tokens else None,
                 savings=money(summary.savings), savings_share=summary.savings_share,
                 baseline_name=summary.baseline_channel.name if summary.baseline_channel else "",
                 missing_prices=sorted(set(summary.missing_prices)))


def failing_channels(team):
    found = []
    for channel in listed_channels(team).filter(enabled=True).order_by("name"):
        why = channel.problem or channel.test_failure
        if why:
            found.append(Attention(f"Channel {channel.name}", why, reverse("channel_detail", args=[channel.pk])))
    return found


def failed_jobs(team, now):
    since = datetime.fromtimestamp(now, tz=dt_timezone.utc) - timedelta(days=FAILED_JOBS_DAYS)
    jobs = []
    for model in job_models():
        jobs += list(model.objects.filter(team=team, state=model.FAILED, finished_at__gte=since)
                     .order_by("-finished_at")[:FAILED_JOBS_SHOWN])
    jobs.sort(key=lambda job: job.finished_at, reverse=True)
    found = []
    for job in jobs[:FAILED_JOBS_SHOWN]:
        kind = job.job_type()
        page = JOB_PAGES.get(kind)
        link = reverse(page, args=[job.pk]) if page else reverse("model_detail", args=[job.model_id])
        found.append(Attention(f"{JOB_NAMES.get(kind, kind)} #{job.pk} failed",
                               (job.failure_reason or job.failure_kind or "no reason recorded").splitlines()[0][:300],
                               link))
    return found


def ledger_differences(team, now):
    """Deployments (and vLLM pools) whose engine counted more than a percent more or fewer tokens than the usage rows
    in the last 24 hours (panel/dashboards/ledger.py): money the gateway did not charge, or charged by estimate."""
    query = DashboardQuery(team=team, range="24h", now=now)
    found = []
    for line in deployment_ledger(query):
        if line.difference_percent is not None and not line.agrees:
            subject, scope = line.subject
            found.append(Attention(f"{subject}: ledger differs by {line.difference_percent:+.1f}%", line.words,
                                   reverse("dashboards_cost") + f"?range=24h&{scope}"))
    return found


def overview(*, team, now):
    """Everything the overview page shows for `team` at `now` (epoch seconds)."""
    deployments = list(Deployment.objects.filter(team=team, state__in=list(ACTIVE_DEPLOYMENT_STATES))
                       .select_related("profile__model", "host").order_by("-created_at"))
    return Overview(month=month_figures(team, now), deployments=deployments,
                    attention=failing_channels(team) + failed_jobs(team, now) + ledger_differences(team, now))
