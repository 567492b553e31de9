"""Budgets (as on Budgets): this month's use of the team, of each key and of each budgeted tag against their limits,
and setting them."""
from decimal import Decimal

from ninja import Field, Router, Schema

from panel.accounts.models import TeamKey
from panel.api.auth import gate
from panel.api.errors import Invalid, errors
from panel.api.form_bodies import validated
from panel.api.schemas import Money
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.budgets.counters import month_of
from panel.budgets.forms import TAG, TEAM, BudgetForm
from panel.budgets.services import budget_set, budget_target, budget_usage

router = Router(tags=["budgets"])


class UseOut(Schema):
    scope: str = Field(description="team, key or tag")
    id: int | None = Field(description="The team's or the key's id; empty for a tag.")
    tag: str | None = Field(None, description="A tag budget's tag (the requests that carry it).")
    name: str
    month: str
    money: Money
    tokens: int
    money_per_month: Money | None
    tokens_per_month: int | None
    level: str = Field(description="ok, alert (80% or more) or exhausted")


class BudgetIn(Schema):
    key: int | None = Field(None, ge=1, le=2**53, description="A key id of this team; empty: the whole team.")
    tag: str | None = Field(None, max_length=200, description="A tag: the budget of the team's requests that carry "
                                                             "it (not with `key`).")
    money_per_month: Decimal | None = Field(None, ge=0, max_digits=14, decimal_places=2, allow_inf_nan=False)
    tokens_per_month: int | None = Field(None, ge=0, le=10**15)


def uses(team):
    month = month_of()
    return [{"scope": use.scope, "id": None if use.scope == "tag" else use.ident,
             "tag": use.budget.tag if use.scope == "tag" else None, "name": use.name, "month": month,
             "money": use.money, "tokens": use.tokens,
             "money_per_month": use.budget.money_per_month if use.budget else None,
             "tokens_per_month": use.budget.tokens_per_month if use.budget else None, "level": use.level}
            for use in budget_usage(team=team)]


def _keys(team):
    return TeamKey.objects.filter(team=team, revoked_at__isnull=True).order_by("name")


@router.get("/budgets", auth=gate("budgets.view"), response=errors({200: list[UseOut]}))
def budgets_list(request):
    return uses(request.team)


@router.put("/budgets", auth=gate("budgets.edit"), response=errors({200: list[UseOut]}),
            summary="Set the monthly budget of the team, of one key or of one tag (both limits empty removes it)")
def budgets_set(request, body: BudgetIn):
    if body.key and body.tag:
        raise Invalid({"tag": ["A budget is a key's or a tag's, not both: send key or tag."]})
    given = {"target": str(body.key) if body.key else TAG if body.tag else TEAM, "tag": body.tag or "",
             "money_per_month": body.money_per_month, "tokens_per_month": body.tokens_per_month}
    data = validated(BudgetForm, given, keys=_keys(request.team)).cleaned_data
    before, after = budget_set(team=request.team, key=data["key"], tag=data["tag"],
                               money_per_month=data["money_per_month"], tokens_per_month=data["tokens_per_month"],
                               user=request.user)
    if before != after:
        target = budget_target(request.team, data)
        audit_record(action=AuditAction.BUDGET_CHANGED, request=request, target=target, before=before, after=after)
    return uses(request.team)
