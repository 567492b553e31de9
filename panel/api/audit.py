"""The audit log (as on Audit): the team's events, newest first, filtered and paged by a cursor."""
import datetime
from typing import Any

from ninja import Field, Query, Router, Schema

from panel.accounts.selectors import team_audit_events
from panel.api.auth import gate
from panel.api.errors import errors
from panel.audit.models import AuditAction

router = Router(tags=["audit"])


class AuditQuery(Schema):
    action: str | None = Field(None, pattern=r"^[a-z_]{1,30}$", description=", ".join(AuditAction.values))
    actor: str | None = Field(None, max_length=150)
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    cursor: int | None = Field(None, ge=1, le=2**53, description="next_cursor of the page before.")
    limit: int = Field(200, ge=1, le=1000)


class AuditOut(Schema):
    id: int
    at: datetime.datetime
    actor: str
    action: str
    target: str
    detail: dict[str, Any]
    address: str | None


class AuditPage(Schema):
    items: list[AuditOut]
    next_cursor: int | None


@router.get("/audit", auth=gate("audit.view"), response=errors({200: AuditPage}))
def audit_list(request, query: Query[AuditQuery]):
    events = team_audit_events(team=request.team, action=query.action or "", actor=(query.actor or "").strip(),
                               since=query.since, until=query.until).order_by("-id")
    if query.cursor:
        events = events.filter(id__lt=query.cursor)
    rows = list(events[:query.limit])
    items = [{"id": event.pk, "at": event.at, "actor": event.actor_name, "action": event.action,
              "target": event.target, "detail": event.detail, "address": event.address} for event in rows]
    return {"items": items, "next_cursor": rows[-1].pk if len(rows) == query.limit else None}
