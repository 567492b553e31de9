"""Shapes shared by several resources."""
import datetime

from ninja import Schema


class Done(Schema):
    ok: bool
    detail: str


class JobEventOut(Schema):
    at: datetime.datetime
    from_state: str
    to_state: str
    actor: str | None
    reason: str


def job_events_out(events):
    return [{"at": event.at, "from_state": event.from_state, "to_state": event.to_state,
             "actor": event.actor.get_username() if event.actor else None, "reason": event.reason}
            for event in events]


class JobOut(Schema):
    """What every job kind shares: state, progress, phase, failure, timestamps."""
    id: int
    state: str
    progress: int
    phase: str
    failure_kind: str
    failure_reason: str
    created_at: datetime.datetime
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    heartbeat_at: datetime.datetime | None
