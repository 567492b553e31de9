"""Benchmark traffic counted against the team's monthly budget, as the gateway's and Compare's traffic is.

A benchmark calls its channels directly (not through the gateway), so it counts its own spend: each finished request
(warm-up ones too) is queued by the load's event loop (`runner.Progress.spent`) and counted by the run's heartbeat
thread through a plain Redis client (panel/budgets/enforcement.py, `team_count_sync`): nothing blocks the load's
loop. A run is refused at launch when the team's budget is spent, is failed before its first request when it is
spent by then, and stops sending when its own requests spend it (overshoot: what was in flight, plus at most one
heartbeat of requests). Priced with the channel that answered (a deployment: its local channel's prices, if any).
The spend is counted in the budget counters only (no usage rows: a benchmark is not the team's traffic in the
dashboards), so a Redis flush forgets it."""
from decimal import Decimal

from django.core.exceptions import ValidationError

from panel.benchmarks.models import TargetKind
from panel.budgets.enforcement import team_count_sync, team_refusal_sync
from panel.channels.models import Channel


def launch_check(team_id):
    """ValidationError (shown on the benchmark form) when the team's budget is spent."""
    words = team_refusal_sync(team_id)
    if words:
        raise ValidationError(f"Not started: {words}. Benchmarks count against the team's budget.")


class RunSpend:
    """One run's spend: counted from the heartbeat thread, and whether the budget now refuses more."""

    def __init__(self, run):
        self.team_id = run.team_id
        self.refusal = None
        self.channels = {}  # endpoint label -> the channel whose prices apply
        self.default = None
        if run.target_kind == TargetKind.CHANNEL and run.channel is not None:
            self.channels[run.channel.name] = run.channel
        elif run.target_kind == TargetKind.ROUTE and run.route is not None:
            self.channels.update({entry.channel.name: entry.channel for entry in run.route.entries()})
        elif run.target_kind == TargetKind.DEPLOYMENT and run.deployment_id:
            self.default = Channel.objects.filter(deployment_id=run.deployment_id, team_id=run.team_id).first()

    def check(self):
        """The refusal's words when the team's budget is spent, else None."""
        self.refusal = team_refusal_sync(self.team_id)
        return self.refusal

    def flush(self, progress):
        """Count what finished since the last flush; when the budget is then spent, stop the load."""
        cost, tokens = Decimal(0), 0
        while progress.spent:
            label, prompt, output = progress.spent.popleft()
            channel = self.channels.get(label, self.default)
            tokens += prompt + output
            if channel is not None:
                cost += channel.cost(prompt, output)
        if cost > 0 or tokens > 0:
            team_count_sync(self.team_id, cost, tokens)
            words = team_refusal_sync(self.team_id)
            if words and not progress.stop:
                self.refusal = words
                progress.stop = True
