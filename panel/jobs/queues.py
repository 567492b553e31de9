"""The queues jobs wait on, and a team's share of the long one.

`default` keeps the short periodic work (the reaper, scrapes, rollups, canary checks, budgets, webhooks, the
scaler), served by the default worker; `long` holds the work a member starts that runs for minutes or hours
(evaluation runs, benchmark runs, ladders, sweeps), served by a worker of its own, so that work never holds the
periodic tasks up. `gpu` and `gpu.<host>` are the GPU workers'. A team has at most TOKENWISE_TEAM_LONG_RUNS long
runs queued or running at once; one more is refused (`LongRunsFull`), so one team cannot fill the long worker for
every other."""
from django.conf import settings
from django.core.exceptions import ValidationError

from panel.accounts.models import Team
from panel.jobs.services import job_models

DEFAULT_QUEUE = "default"
LONG_QUEUE = "long"


class LongRunsFull(ValidationError):
    """The team already has as many long runs queued or running as it may: the API answers 429, a page shows the
    words in its form."""


def long_runs_active(team):
    """How many of `team`'s jobs wait on or run from the long queue (a ladder's or sweep's own benchmark runs run
    inside it and are never queued: they do not count)."""
    return sum(model.objects.filter(team=team, queue=LONG_QUEUE, state__in=list(model.ACTIVE_STATES)).count()
               for model in job_models())


def long_run_admit(team):
    """Call inside the transaction that inserts a long run, before the insert: raises LongRunsFull while the team
    is at its limit. The team's row is locked until that transaction ends (PostgreSQL), so two launches at once
    cannot both take the last slot."""
    Team.objects.select_for_update().filter(pk=team.pk).first()
    limit = settings.TEAM_LONG_RUNS
    if long_runs_active(team) >= limit:
        raise LongRunsFull(
            f"Your team already has {limit} evaluation or benchmark run{'s' if limit != 1 else ''} queued or "
            f"running, the most it may have at once: wait for one to finish, or cancel one, then start this again.",
            code="long_runs_full")
