from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.models import TeamKey
from panel.accounts.roles import may
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.budgets.counters import month_bounds, month_of
from panel.budgets.forms import BudgetForm
from panel.budgets.services import budget_set, budget_target, budget_usage


def _keys(team):
    return TeamKey.objects.filter(team=team, revoked_at__isnull=True).order_by("name")


def _page(request, form=None, status=200):
    month = month_of()
    return render(request, "budgets/list.html", {
        "uses": budget_usage(team=request.team), "form": form or BudgetForm(keys=_keys(request.team)),
        "can_edit": may(request.membership, "budgets.edit"), "month": month,
        "renews": month_bounds(month)[1]}, status=status)


@team_view("budgets.view")
def budget_list(request):
    return _page(request)


@require_POST
@team_view("budgets.edit")
def budget_edit(request):
    form = BudgetForm(request.POST, keys=_keys(request.team))
    if not form.is_valid():
        return _page(request, form, status=400)
    data = form.cleaned_data
    before, after = budget_set(team=request.team, key=data["key"], tag=data["tag"],
                               money_per_month=data["money_per_month"], tokens_per_month=data["tokens_per_month"],
                               user=request.user)
    target = budget_target(request.team, data)
    if before != after:
        audit_record(action=AuditAction.BUDGET_CHANGED, request=request, target=target, before=before, after=after)
        messages.success(request, f"Saved the budget of {target}. The gateway applies it within seconds.")
    return redirect("budgets")
