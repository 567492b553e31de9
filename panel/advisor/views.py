from django.conf import settings
from django.shortcuts import render

from panel.accounts.decorators import team_view
from panel.advisor.planner import DAYS, deployment_plan
from panel.advisor.services import CHECKS, advice


@team_view("advisor.view")
def advisor(request):
    """Recommendations read from the team's traffic, profiles, deployments and models, and the break-even planner
    over the last 7 or 30 days (?days=): every member reads them."""
    found = advice(team=request.team)
    fired = {item.rule for item in found}
    checks = [(slug, words, slug in fired) for slug, words in CHECKS]
    days = int(request.GET["days"]) if request.GET.get("days") in {str(d) for d in DAYS} else DAYS[0]
    return render(request, "advisor/advisor.html", {"recommendations": found, "checks": checks,
                                                    "window_hours": settings.ADVISOR_WINDOW_HOURS,
                                                    "plan": deployment_plan(request.team, days=days), "days": days,
                                                    "day_choices": DAYS})
