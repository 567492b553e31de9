"""The team's audit log page (admins): filters and a CSV export. The log itself is the audit app's."""
import csv
from datetime import datetime, time

from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone

from panel.accounts.decorators import team_view
from panel.accounts.selectors import team_audit_events
from panel.audit.models import AuditAction
from panel.core.csv_cells import csv_row

PAGE = 200


def _filtered(request):
    bounds = {}
    for name, moment in (("since", time.min), ("until", time.max)):
        value = request.GET.get(name, "")
        if value:
            try:
                day = datetime.strptime(value, "%Y-%m-%d").date()
            except ValueError:
                continue
            bounds[name] = timezone.make_aware(datetime.combine(day, moment), timezone.utc)
    return team_audit_events(team=request.team, action=request.GET.get("action", ""),
                             actor=request.GET.get("actor", "").strip(), **bounds)


@team_view("audit.view")
def audit_list(request):
    return render(request, "audit/list.html", {"events": _filtered(request)[:PAGE], "actions": AuditAction.choices,
                                               "query": request.GET})


@team_view("audit.view")
def audit_csv(request):
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="tokenwise-audit.csv"'
    writer = csv.writer(response)
    writer.writerow(["at (UTC)", "actor", "action", "target", "address", "detail"])
    for event in _filtered(request).iterator():
        writer.writerow(csv_row([event.at.isoformat(), event.actor_name, event.action, event.target,
                                 event.address or "", event.detail]))
    return response
