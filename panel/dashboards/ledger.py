"""The ledger: what each deployment's engine counted, or each vLLM pool's engines together (vLLM's prompt and
generation token counters, from the scraped /metrics) against what the gateway recorded for it (the usage rows'
prompt and completion tokens: a deployment's, a pool channel's) over the same range. They agree within a percent
when every request the engine served went through the gateway and was charged what the engine counted; a larger
difference has a likely cause, which the line names."""
import time
from dataclasses import dataclass

from django.db import transaction

from panel.channels.models import Channel, ChannelKind
from panel.dashboards.models import HOUR
from panel.dashboards.selectors import DashboardQuery, engine_by_deployment, source, usage_grouped

TOLERANCE_PERCENT = 1.0


@dataclass
class LedgerLine:
    deployment_id: int | None  # None: a vLLM pool's line (`source` names it)
    engine_tokens: float  # prompt + generation, as the engine counted them
    recorded_tokens: int  # prompt + completion, as the usage rows have them
    gaps: int  # failed scrapes in the range: the engine's count is short by what they missed
    source: tuple = ()  # selectors.source: ("deployment", id) or ("pool", channel id)
    pool_name: str = ""

    @property
    def subject(self):
        """What the line is of, in words, and the dashboards' filter for it."""
        if self.source and self.source[0] == "pool":
            return f"vLLM pool {self.pool_name}", f"channel={self.source[1]}"
        return f"Deployment #{self.deployment_id}", f"deployment={self.deployment_id}"

    @property
    def difference_percent(self):
        """(engine - recorded) / engine, in percent; None without engine counts."""
        if not self.engine_tokens:
            return None
        return 100.0 * (self.engine_tokens - self.recorded_tokens) / self.engine_tokens

    @property
    def agrees(self):
        return self.difference_percent is not None and abs(self.difference_percent) <= TOLERANCE_PERCENT

    @property
    def words(self):
        difference = self.difference_percent
        if difference is None:
            return "no engine counts in this range" + (" (its scrapes failed)" if self.gaps else "")
        if self.agrees:
            return "agrees"
        gap = f"; {self.gaps} scrapes failed in this range, so the engine's count is short" if self.gaps else ""
        if difference > 0:
            return (f"the engine served {difference:.1f}% more tokens than the gateway recorded: requests that "
                    f"reached the engine without the gateway, or clients that left before their usage{gap}")
        return (f"the gateway recorded {-difference:.1f}% more tokens than the engine counted: figures estimated "
                f"for clients that left, or an engine that restarted{gap}")


def deployment_ledger(query):
    """A LedgerLine per deployment or vLLM pool that served or was scraped in the query's range, differences
    first."""
    engine = {row["source"]: row for row in engine_by_deployment(query)}
    pools = dict(Channel.objects.filter(team=query.team, kind=ChannelKind.POOL).values_list("pk", "name"))
    recorded = {}
    for row in usage_grouped(query, by=("deployment_id", "channel_id"), columns=("prompt_tokens", "completion_tokens")):
        if row["deployment_id"] is None and row["channel_id"] not in pools:
            continue  # a cloud channel's: its provider's export is the check (statements.py)
        key = source(row["deployment_id"], row["channel_id"])
        recorded[key] = recorded.get(key, 0) + row["prompt_tokens"] + row["completion_tokens"]
    lines = []
    for key in sorted(set(engine) | set(recorded)):
        counted = engine.get(key, {})
        lines.append(LedgerLine(deployment_id=key[1] if key[0] == "deployment" else None, source=key,
                                pool_name=pools.get(key[1], "") if key[0] == "pool" else "",
                                recorded_tokens=recorded.get(key, 0),
                                engine_tokens=counted.get("prompt_tokens", 0.0) + counted.get("generation_tokens", 0.0),
                                gaps=counted.get("gaps", 0)))
    return sorted(lines, key=lambda line: (line.agrees, line.source))


def ledgers_check(*, now=None):
    """Beat, hourly: for every team, the last whole hour's ledger; a deployment (or vLLM pool) whose engine and usage
    rows differ by more than TOLERANCE_PERCENT is notified once for that hour (ledger.mismatch: the page and the
    webhooks).
    Returns the notifications made."""
    from panel.accounts.models import Team
    from panel.notifications.models import EventKind, Notification
    from panel.notifications.services import notify

    end = int((time.time() if now is None else now) // HOUR * HOUR)
    made = []
    teams = Team.objects.filter(deployments__isnull=False) | Team.objects.filter(channels__kind=ChannelKind.POOL)
    for team in teams.distinct():
        for line in deployment_ledger(DashboardQuery(team=team, range="1h", now=end)):
            if line.difference_percent is None or line.agrees:
                continue
            with transaction.atomic():
                of = {"deployment_id": line.deployment_id} if line.deployment_id is not None else {
                    "pool_channel_id": line.source[1]}
                if Notification.objects.filter(team=team, kind=EventKind.LEDGER_MISMATCH, facts__hour=end,
                                               **{f"facts__{name}": value for name, value in of.items()}).exists():
                    continue
                made.append(notify(team=team, kind=EventKind.LEDGER_MISMATCH,
                                   title=f"{line.subject[0]}: its engine's token count differs from "
                                         f"the usage rows by {line.difference_percent:+.1f}% in the hour to "
                                         f"{time.strftime('%H:%M UTC', time.gmtime(end))}: {line.words}",
                                   **of, hour=end,
                                   engine_tokens=int(line.engine_tokens), recorded_tokens=line.recorded_tokens,
                                   difference_percent=round(line.difference_percent, 2)))
    return made
