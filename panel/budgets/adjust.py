"""A usage record's cost that moves after its request was counted moves its budgets' counters by the same amount.

The gateway counts a request's cost against its team's, its key's and each of its tags' money counters when the
request ends (enforcement.count). A step that later changes a recorded cost (the local GPU cost allocation,
dashboards/local_cost.py) hands each record's change to `budget_money_adjust` once its transaction has committed,
and the counters of the record's month move by exactly that change: up when a minute's GPU cost is first split,
down for the rows that give a share back when a minute is split again. The step moves a cost by the difference
from what the record carried, so a step done twice hands over nothing the second time.

Redis unreachable: the change is not counted and the reconciliation (services.budgets_reconcile) raises the counters
to the records' sums within one period; a decrease it cannot make, so a lost decrease leaves a counter that much
high until the month ends."""
import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from redis.exceptions import RedisError

from panel.budgets.counters import TTL_SECONDS, counter_keys, money_units, month_of, tag_ident
from panel.core.redis_client import sync_redis
from panel.usage.tags import tags_read

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CostChange:
    """How much one usage record's cost moved, and whose budgets the record counts against."""

    team_id: int | None
    key_id: int | None
    tags: str | None  # as the record keeps them: "|a|b|"
    created_at: datetime  # the record's month is the month whose counters move
    amount: Decimal


def budget_money_moves(changes):
    """{money counter: units} for `changes`: each one against its month's team counter, its key's (a request made
    inside the panel has none) and each of its tags', as the gateway counted the request; summed per counter, those
    that net to nothing left out. A record without a team counts against no budget."""
    moves = defaultdict(int)
    for change in changes:
        units = money_units(change.amount)
        if change.team_id is None or not units:
            continue
        month = month_of(change.created_at)
        scopes = ([("team", change.team_id)] + ([("key", change.key_id)] if change.key_id is not None else [])
                  + [("tag", tag_ident(change.team_id, tag)) for tag in tags_read(change.tags)])
        for scope, ident in scopes:
            moves[counter_keys(month, scope, ident)[0]] += units
    return {counter: units for counter, units in moves.items() if units}


def budget_money_adjust(changes):
    """Move the money counters by `changes` (CostChange), in one round trip. Call it once the changes have
    committed (transaction.on_commit): a counter never counts a change the records do not have. Returns False
    when Redis did not answer (the reconciliation catches up), else True."""
    moves = budget_money_moves(changes)
    if not moves:
        return True
    try:
        pipe = sync_redis().pipeline(transaction=True)
        for counter, units in moves.items():
            pipe.incrby(counter, units)
            pipe.expire(counter, TTL_SECONDS)
        pipe.execute()
    except (RedisError, OSError) as error:
        log.warning("budget counters not moved by %s recorded cost changes (%s); the reconciliation will raise "
                    "them to the records' sums", len(changes), type(error).__name__)
        return False
    return True
