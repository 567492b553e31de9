"""Reads of the accounts app that need care."""
from django.db.models import Q

from panel.audit.models import AuditAction, AuditEvent


def team_audit_events(*, team, action="", actor="", since=None, until=None):
    """The team's own events, and the sign-ins of its members (those belong to no team), newest first; `since` and
    `until` are aware datetimes (inclusive)."""
    members = team.memberships.values("user_id")
    events = AuditEvent.objects.filter(Q(team=team) | Q(team__isnull=True, actor__in=members))
    if action in AuditAction.values:
        events = events.filter(action=action)
    if actor:
        events = events.filter(actor_name__icontains=actor)
    if since is not None:
        events = events.filter(at__gte=since)
    if until is not None:
        events = events.filter(at__lte=until)
    return events
