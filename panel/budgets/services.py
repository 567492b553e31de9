"""Budgets: setting them, reading the month's use against them, and the reconciliation that keeps the gateway's
Redis counters true to the usage records and raises the 80% and 100% notices once a month."""
from dataclasses import dataclass
from decimal import Decimal

import redis
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Sum

from panel.accounts.models import Team, TeamKey
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.budgets.counters import (
    RAISE_TO_AT_LEAST,
    TTL_SECONDS,
    counter_keys,
    held_keys,
    money_from_units,
    money_units,
    month_bounds,
    month_of,
    tag_ident,
)
from panel.budgets.models import Budget, BudgetNotice
from panel.notifications.models import EventKind
from panel.notifications.services import notify
from panel.usage.models import RequestLog
from panel.usage.tags import tag_lookup

ALERT_AT = Decimal("0.8")


def _redis():
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def _limits(budget):
    if budget is None:
        return {"money_per_month": None, "tokens_per_month": None}
    return {"money_per_month": None if budget.money_per_month is None else str(budget.money_per_month),
            "tokens_per_month": budget.tokens_per_month}


@transaction.atomic
def budget_set(*, team, key=None, tag="", money_per_month=None, tokens_per_month=None, user=None):
    """Set the monthly budget of `team`, of its `key` or of its requests that carry `tag` (a cleaned tag:
    panel/usage/tags.py); both limits blank removes it. Returns (before, after), each {"money_per_month",
    "tokens_per_month"}, for the audit."""
    if key is not None and key.team_id != team.pk:
        raise ValueError("the key belongs to another team")
    if key is not None and tag:
        raise ValueError("a budget is a key's or a tag's, not both")
    budget = Budget.objects.select_for_update().filter(team=team, key=key, tag=tag).first()
    before = _limits(budget)
    if money_per_month is None and tokens_per_month is None:
        if budget is not None:
            budget.delete()
        return before, _limits(None)
    if budget is None:
        budget = Budget(team=team, key=key, tag=tag)
    budget.money_per_month, budget.tokens_per_month, budget.updated_by = money_per_month, tokens_per_month, user
    budget.save()

    def count_past_spend():
        try:
            budget_counters_raise(team_id=team.pk)
        except (redis.RedisError, OSError):  # the reconciliation catches up
            pass

    transaction.on_commit(count_past_spend)
    return before, _limits(budget)


def budget_target(team, data):
    """The audit's and the message's name for a budget form's target: "team …", "key …" or "tag …"."""
    if data["tag"]:
        return f"tag {data['tag']}"
    return f"key {data['key']}" if data["key"] else f"team {team}"


def budget_spend_recorded(*, team_id, month, tags=()):
    """The month's spend in the usage records: {("team", id), ("key", id) or ("tag", tag_ident): (money, tokens)},
    the tags' for each of `tags` (those with a budget: one query each)."""
    start, end = month_bounds(month)
    month_rows = RequestLog.objects.filter(team_id=team_id, created_at__gte=start, created_at__lt=end)
    spent = {"money": Sum("cost"), "tokens": Sum(F("prompt_tokens") + F("completion_tokens"))}
    spend = {("team", team_id): (Decimal(0), 0)}
    for row in month_rows.values("key_id").annotate(**spent):
        money, tokens = Decimal(row["money"] or 0), int(row["tokens"] or 0)
        team_money, team_tokens = spend[("team", team_id)]
        spend[("team", team_id)] = (team_money + money, team_tokens + tokens)
        if row["key_id"] is not None:
            spend[("key", row["key_id"])] = (money, tokens)
    for tag in tags:
        row = month_rows.filter(**tag_lookup(tag)).aggregate(**spent)
        spend[("tag", tag_ident(team_id, tag))] = (Decimal(row["money"] or 0), int(row["tokens"] or 0))
    return spend


def _budgeted_tags(team_id):
    return list(Budget.objects.filter(team_id=team_id).exclude(tag="").order_by("tag").values_list("tag", flat=True))


def _counted(client, month, scopes):
    """The Redis counters of `scopes` [(scope, id)]: {(scope, id): (money, tokens, money held, tokens held)}, the
    held figures what requests in flight hold against the budget (budgets/reservations.py)."""
    names = [name for scope, ident in scopes
             for name in (*counter_keys(month, scope, ident), *held_keys(month, scope, ident))]
    values = client.mget(names) if names else []
    return {scopes[i]: (money_from_units(values[4 * i]), int(values[4 * i + 1] or 0),
                        money_from_units(values[4 * i + 2]), int(values[4 * i + 3] or 0)) for i in range(len(scopes))}


@dataclass
class Use:
    """One team's, key's or tag's use this month against its budget (budget None: no budget, use shown anyway)."""
    scope: str
    ident: int | str  # a team's or key's id, a tag's tag_ident
    name: str
    budget: Budget | None
    money: Decimal
    tokens: int
    held_money: Decimal = Decimal(0)  # what requests in flight hold against the budget
    held_tokens: int = 0

    def _fraction(self, spent, limit):
        if limit is None:
            return None
        return Decimal(1) if limit <= 0 else Decimal(spent) / Decimal(limit)

    @property
    def money_fraction(self):
        return self._fraction(self.money, self.budget.money_per_month if self.budget else None)

    @property
    def tokens_fraction(self):
        return self._fraction(self.tokens, self.budget.tokens_per_month if self.budget else None)

    @property
    def fraction(self):
        known = [f for f in (self.money_fraction, self.tokens_fraction) if f is not None]
        return max(known) if known else None

    @property
    def money_percent(self):
        return None if self.money_fraction is None else min(int(self.money_fraction * 100), 100)

    @property
    def tokens_percent(self):
        return None if self.tokens_fraction is None else min(int(self.tokens_fraction * 100), 100)

    @property
    def level(self):
        fraction = self.fraction
        if fraction is None or fraction < ALERT_AT:
            return "ok"
        return "exhausted" if fraction >= 1 else "alert"


def budget_usage(*, team, recorded=True, month=None):
    """The month's use of the team, of each of its keys and of each tag with a budget, against their budgets. The
    use is the larger of the Redis counters and (when `recorded`) the usage records, so neither a flush nor the
    writer's lag hides spend. The banner passes recorded=False: it must stay cheap on every page."""
    month = month or month_of()
    rows = list(Budget.objects.filter(team=team).select_related("key"))
    budgets = {("tag", tag_ident(team.pk, b.tag)) if b.tag else ("key", b.key_id) if b.key_id else ("team", team.pk): b
               for b in rows}
    keys = list(TeamKey.objects.filter(team=team).order_by("name")) if recorded else [b.key for b in rows if b.key_id]
    tags = sorted(b.tag for b in rows if b.tag)
    scopes = ([("team", team.pk)] + [("key", key.pk) for key in keys]
              + [("tag", tag_ident(team.pk, tag)) for tag in tags])
    try:
        counted = _counted(_redis(), month, scopes)
    except (redis.RedisError, OSError):
        counted = {}
    spend = budget_spend_recorded(team_id=team.pk, month=month, tags=tags) if recorded else {}
    names = {("team", team.pk): f"Whole team ({team.name})", **{("key", k.pk): f"Key {k}" for k in keys},
             **{("tag", tag_ident(team.pk, tag)): f"Tag {tag}" for tag in tags}}
    uses = []
    for scope, ident in scopes:
        money_a, tokens_a, held_money, held_tokens = counted.get((scope, ident), (Decimal(0), 0, Decimal(0), 0))
        money_b, tokens_b = spend.get((scope, ident), (Decimal(0), 0))
        uses.append(Use(scope, ident, names[(scope, ident)], budgets.get((scope, ident)),
                        max(money_a, money_b), max(tokens_a, tokens_b), max(held_money, Decimal(0)),
                        max(held_tokens, 0)))
    return uses


def _budget_notify(team, use, level, month):
    limits = _limits(use.budget)
    exhausted = level == BudgetNotice.Level.EXHAUSTED
    notify(team=team, kind=EventKind.BUDGET_EXHAUSTED if exhausted else EventKind.BUDGET_ALERT,
           title=f"{use.name}: {'budget spent' if exhausted else '80% of the budget used'} in {month}",
           budget=use.name, month=month, money=f"{use.money:.2f}", tokens=use.tokens, **limits)


def budgets_reconcile(*, month=None):
    """For every team with a budget: raise the Redis counters to at least the usage records' sums, and record (and
    audit) each budget's 80% and 100% notice once a month. Returns the notices created."""
    month = month or month_of()
    client = _redis()
    raise_script = client.register_script(RAISE_TO_AT_LEAST)
    created = []
    for team in Team.objects.filter(budgets__isnull=False).distinct():
        spend = budget_spend_recorded(team_id=team.pk, month=month, tags=_budgeted_tags(team.pk))
        for (scope, ident), (money, tokens) in spend.items():
            money_key, tokens_key = counter_keys(month, scope, ident)
            raise_script(keys=[money_key], args=[money_units(money), TTL_SECONDS])
            raise_script(keys=[tokens_key], args=[tokens, TTL_SECONDS])
        for use in budget_usage(team=team, recorded=True, month=month):
            if use.budget is None or use.level == "ok":
                continue
            levels = [BudgetNotice.Level.ALERT] + ([BudgetNotice.Level.EXHAUSTED] if use.level == "exhausted" else [])
            created += _notices_raise(team, use, levels, month)
    return created


def _notices_raise(team, use, levels, month):
    """Record, notify and audit each of `levels` for `use`'s budget, unless already recorded this month."""
    created = []
    for level in levels:
        try:
            with transaction.atomic():
                notice, new = BudgetNotice.objects.get_or_create(budget=use.budget, month=month, level=level)
                if new:  # the webhooks hear of it in the notice's own transaction
                    _budget_notify(team, use, level, month)
        except IntegrityError:  # another process got there first
            continue
        if not new:
            continue
        created.append(notice)
        audit_record(action=AuditAction.BUDGET_ALERT if level == BudgetNotice.Level.ALERT
                     else AuditAction.BUDGET_EXHAUSTED, team=team, target=use.name, month=month,
                     money=f"{use.money:.2f}", tokens=use.tokens, **_limits(use.budget))
    return created


def budget_crossed(*, team_id, key_id, levels, month, tag=""):
    """The gateway saw a request take a budget (the team's, `key_id`'s or `tag`'s) past `levels` ("alert",
    "exhausted"): raise those notices now, in that order, once a month. Returns the notices created."""
    team = Team.objects.filter(pk=team_id).first()
    if team is None:
        return []
    wanted = ("tag", tag_ident(team_id, tag)) if tag else ("key", key_id) if key_id else ("team", team_id)
    uses = [use for use in budget_usage(team=team, recorded=False, month=month) if (use.scope, use.ident) == wanted]
    if not uses or uses[0].budget is None:
        return []
    return _notices_raise(team, uses[0], levels, month)


def budget_counters_raise(*, team_id, month=None):
    """Raise the team's Redis counters to at least the usage records' sums for the month (a budget just set counts
    the spend that came before it at once)."""
    month = month or month_of()
    client = _redis()
    raise_script = client.register_script(RAISE_TO_AT_LEAST)
    for (scope, ident), (money, tokens) in budget_spend_recorded(team_id=team_id, month=month,
                                                                 tags=_budgeted_tags(team_id)).items():
        money_key, tokens_key = counter_keys(month, scope, ident)
        raise_script(keys=[money_key], args=[money_units(money), TTL_SECONDS])
        raise_script(keys=[tokens_key], args=[tokens, TTL_SECONDS])
