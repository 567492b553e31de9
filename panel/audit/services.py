"""Writing to the audit log: one function, called from the views where things happen."""
from panel.audit.models import AuditEvent


def client_address(request):
    return request.META.get("REMOTE_ADDR") or None if request is not None else None


def audit_record(*, action, request=None, team=None, actor=None, target="", **detail):
    """Append one event. `detail` must hold no secret: names, ids, states only."""
    if request is not None:
        team = team or getattr(request, "team", None)
        if actor is None and getattr(request, "user", None) is not None and request.user.is_authenticated:
            actor = request.user
    return AuditEvent.objects.create(action=action, team=team, actor=actor,
                                     actor_name=actor.get_username() if actor else detail.pop("username", ""),
                                     target=str(target)[:300], detail=detail, address=client_address(request))
