from panel.accounts.services import current_membership
from panel.budgets.models import Budget
from panel.budgets.services import budget_usage


def budget_alerts(request):
    """Template context: `budget_alerts`, the current team's budgets at 80% or more this month. Lazy (a callable the
    template calls once), so pages and live partials that do not show the banner pay nothing."""
    def alerts():
        membership = getattr(request, "membership", None)
        if membership is None and getattr(request, "user", None) is not None and request.user.is_authenticated:
            membership = current_membership(request)
        if membership is None or not Budget.objects.filter(team=membership.team).exists():
            return []
        return [use for use in budget_usage(team=membership.team, recorded=False)
                if use.budget is not None and use.level != "ok"]

    return {"budget_alerts": alerts}
