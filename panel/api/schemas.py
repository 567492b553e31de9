"""Shapes shared by several resources."""
import datetime
from decimal import Decimal
from typing import Annotated

from ninja import Schema
from pydantic import PlainSerializer

# Money in an answer is a plain decimal string ("0.00000000", "12.50"), never an exponent ("0E-8") that a script
# or a spreadsheet misreads.
Money = Annotated[Decimal, PlainSerializer(lambda value: format(value, "f"), return_type=str, when_used="always")]


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
