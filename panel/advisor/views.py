from django.conf import settings
from django.shortcuts import render

from panel.accounts.decorators import team_view
from panel.advisor.services import CHECKS, advice


@team_view("advisor.view")
def advisor(request):
    """Recommendations read from the team's traffic, profiles, deployments and models: every member reads them."""
    found = advice(team=request.team)
    fired = {item.rule for item in found}
    checks = [(slug, words, slug in fired) for slug, words in CHECKS]
    return render(request, "advisor/advisor.html", {"recommendations": found, "checks": checks,
                                                    "window_hours": settings.ADVISOR_WINDOW_HOURS})
