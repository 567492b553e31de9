"""A provider's usage export (CSV) against the usage rows of the cloud channel it bills: per UTC day, the provider's
requests, tokens and cost beside what the gateway recorded for that channel. A day that differs by more than
TOLERANCE_PERCENT in tokens or cost is named, with its likely cause, in the statement and in one notification
(`statement.mismatch`: the page and the webhooks).

Exports differ between providers, so columns are found by their names (COLUMNS): a day or a time (ISO dates and
times, or epoch seconds), input and output tokens, and where present requests, cost and cache columns. Cache reads
and writes named as Anthropic's export names them (cache_read_tokens, cache_write_*) are counted beside the input
tokens, as that export does; OpenAI's input_cached_tokens is part of its input_tokens. The usage rows' prompt tokens
hold both, so each export is read into the same sum. With a `model` column, only the lines of the channel's model
(its name, or a dated version of it) are counted: one provider account often pays for more than the gateway.

The web process checks only the file as a whole (its size, UTF-8, the header's columns: statement_queue) and queues
a StatementImport; a task on the default queue reads every cell and compares (statement_import_run). Numbers are
matched by a strict pattern before any conversion (no exponent, at most MAX_DIGITS whole digits): `1e1000000`
would take Decimal half a minute. The whole file is read and checked before anything is written: a bad cell is
refused with its line and its column."""
import csv
import io
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

from django.db import transaction
from django.db.models import Count, Q, Sum

from panel.jobs.services import job_claim, job_created, job_enqueue, job_fail, job_succeed
from panel.usage.models import RequestLog

TOLERANCE_PERCENT = 1.0
MAX_BYTES = 5 * 1024 * 1024
MAX_LINES = 200_000
MAX_DAYS = 400
MAX_ERRORS = 10
MAX_DIGITS = 15  # whole digits of a count or an amount
MAX_DECIMALS = 12  # of an amount
# Digits, optionally grouped by thousands; an amount may start with $ and have decimals; nothing else (no sign, no
# exponent). Matched before any conversion, so a cell's cost is bounded by its length.
_WHOLE_DIGITS = rf"(?:\d{{1,{MAX_DIGITS}}}|\d{{1,3}}(?:,\d{{3}}){{1,4}})"
_COUNT = re.compile(rf"{_WHOLE_DIGITS}(?:\.0{{1,{MAX_DECIMALS}}})?")
_AMOUNT = re.compile(rf"\$?{_WHOLE_DIGITS}(?:\.\d{{1,{MAX_DECIMALS}}})?|\$?\.\d{{1,{MAX_DECIMALS}}}")

# What each figure may be called in a provider's export (lower case, spaces as underscores).
COLUMNS = {
    "time": ("day", "date", "usage_date_utc", "usage_date", "start_time", "period_start", "bucket_start",
             "timestamp", "time", "created_at"),
    "input": ("input_tokens", "prompt_tokens", "n_context_tokens_total", "input_tokens_uncached"),
    "output": ("output_tokens", "completion_tokens", "n_generated_tokens_total"),
    "requests": ("requests", "num_model_requests", "n_requests", "request_count", "num_requests"),
    "cost": ("cost_usd", "cost", "amount", "amount_usd", "total_cost"),
    "model": ("model", "model_name", "snapshot_id"),
}
CACHE_BESIDE_INPUT = ("cache_read_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
                      "cache_write_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens")


class StatementError(ValueError):
    """A file that cannot be read as a usage export; the message lists what is wrong, by line and column."""


class CellError(ValueError):
    """A cell that is not what its column holds; the message says what it is not."""


@dataclass
class DayFigures:
    requests: int | None = 0
    tokens: int = 0
    cost: Decimal | None = Decimal(0)


@dataclass
class ParsedExport:
    days: dict  # date -> DayFigures
    reading: str  # how the columns were read, in words
    lines: int = 0
    left_out: int = 0  # lines of other models
    has_requests: bool = False
    has_cost: bool = False
    header: list = field(default_factory=list)
    errors: list = field(default_factory=list)


def _name(header):
    return "_".join(header.strip().lower().replace("-", " ").split())


def _find(names, wanted):
    return next((names.index(name) for name in wanted if name in names), None)


def _day(text):
    text = text.strip()
    if text.replace(".", "", 1).isdigit():  # epoch seconds
        return datetime.fromtimestamp(float(text), tz=timezone.utc).date()
    if len(text) == 10:
        return date.fromisoformat(text)
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (moment if moment.tzinfo is None else moment.astimezone(timezone.utc)).date()


def _whole(text):
    text = text.strip()
    if text == "":
        return 0
    if not _COUNT.fullmatch(text):
        raise CellError(f"not a whole number of 0 or more (at most {MAX_DIGITS} digits)")
    return int(text.split(".")[0].replace(",", ""))


def _money(text):
    text = text.strip()
    if text == "":
        return Decimal(0)
    if not _AMOUNT.fullmatch(text):
        raise CellError(f"not an amount of 0 or more (digits, at most {MAX_DIGITS} before the point and "
                        f"{MAX_DECIMALS} after it, without an exponent)")
    return Decimal(text.lstrip("$").replace(",", ""))


def _matches(model, model_id):
    model, model_id = model.strip().lower(), model_id.strip().lower()
    return model == model_id or (model.startswith(model_id + "-") and model[len(model_id) + 1:][:1].isdigit())


def export_text(payload):
    """The export's text (from bytes or text), or StatementError for a file too large or not UTF-8."""
    if isinstance(payload, bytes):
        if len(payload) > MAX_BYTES:
            raise StatementError(f"The file is larger than {MAX_BYTES // (1024 * 1024)} MB; export fewer days.")
        try:
            payload = payload.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise StatementError("The file is not UTF-8 text: export it as CSV.") from None
    if len(payload) > MAX_BYTES:
        raise StatementError(f"The file is larger than {MAX_BYTES // (1024 * 1024)} MB; export fewer days.")
    return payload


def export_columns(reader):
    """(header, names, {figure: index}) of the export's first line, or StatementError for a missing column."""
    try:
        header = next(reader)
    except (StopIteration, csv.Error):
        raise StatementError("The file is empty: it needs a header line and a line per day.") from None
    names = [_name(cell) for cell in header]
    at = {figure: _find(names, wanted) for figure, wanted in COLUMNS.items()}
    missing = [label for figure, label in (("time", "a day or a time"), ("input", "input tokens"),
                                          ("output", "output tokens")) if at[figure] is None]
    if missing:
        raise StatementError(f"No column for {'; '.join(missing)}. Columns found: {', '.join(header[:20])}. "
                             f"A day is one of {', '.join(COLUMNS['time'])}; input tokens one of "
                             f"{', '.join(COLUMNS['input'])}; output tokens one of {', '.join(COLUMNS['output'])}.")
    return header, names, at


def export_check(payload):
    """The export's text when the file as a whole can be read (size, UTF-8, the columns of its header: cheap, for
    the web process), or StatementError. Its cells are read by export_parse, in the task."""
    text = export_text(payload)
    export_columns(csv.reader(io.StringIO(text[:64 * 1024])))
    return text


def export_parse(payload, *, model_id):
    """A provider's usage export (bytes or text) summed per UTC day, or StatementError naming every bad cell by line
    and column (the first MAX_ERRORS)."""
    reader = csv.reader(io.StringIO(export_text(payload)))
    header, names, at = export_columns(reader)
    beside = [names.index(name) for name in CACHE_BESIDE_INPUT if name in names]
    parsed = ParsedExport(days=defaultdict(DayFigures), reading=_reading(header, at, beside), header=header,
                          has_requests=at["requests"] is not None, has_cost=at["cost"] is not None)
    try:
        for number, row in enumerate(reader, start=2):
            if not any(cell.strip() for cell in row):
                continue
            parsed.lines += 1
            if parsed.lines > MAX_LINES:
                raise StatementError(f"More than {MAX_LINES:,} lines: export fewer days.")
            _add_line(parsed, row, number, at, beside, model_id)
            if len(parsed.errors) >= MAX_ERRORS:
                break
    except csv.Error as error:
        parsed.errors.append(f"line {reader.line_num}: {error}")
    if parsed.errors:
        raise StatementError("; ".join(parsed.errors))
    if not parsed.days:
        raise StatementError(f"No line is for the channel's model {model_id!r}." if parsed.left_out
                             else "The file has a header but no lines.")
    if len(parsed.days) > MAX_DAYS:
        raise StatementError(f"The file covers {len(parsed.days)} days; import at most {MAX_DAYS} at a time.")
    parsed.days = dict(parsed.days)
    return parsed


def _add_line(parsed, row, number, at, beside, model_id):
    def cell(index):
        return row[index] if index is not None and index < len(row) else ""

    if at["model"] is not None and not _matches(cell(at["model"]), model_id):
        parsed.left_out += 1
        return
    try:
        day = _day(cell(at["time"]))
    except (ValueError, OverflowError, OSError):
        parsed.errors.append(f"line {number}, column {_column(parsed, at['time'])}: {cell(at['time'])[:40]!r} is "
                             f"not a date or a time")
        return
    readings = [(index, _whole) for index in (at["input"], at["output"], *beside)]
    readings += [(at["requests"], _whole)] if at["requests"] is not None else []
    readings += [(at["cost"], _money)] if at["cost"] is not None else []
    values = {}
    for index, read in readings:
        try:
            values[index] = read(cell(index))
        except CellError as error:
            parsed.errors.append(f"line {number}, column {_column(parsed, index)}: {cell(index).strip()[:40]!r} is "
                                 f"{error}")
            return
    tokens = sum(values[index] for index in (at["input"], at["output"], *beside))
    requests = values.get(at["requests"]) if at["requests"] is not None else None
    cost = values.get(at["cost"]) if at["cost"] is not None else None
    figures = parsed.days[day]
    figures.tokens += tokens
    figures.requests = None if requests is None else (figures.requests or 0) + requests
    figures.cost = None if cost is None else (figures.cost or Decimal(0)) + cost


def _column(parsed, index):
    """A column as the file's header names it (cut), for words about a cell."""
    return parsed.header[index].strip()[:40] or f"{index + 1}"


def _reading(header, at, beside):
    named = [f"{label} from {header[at[figure]].strip()!r}" for figure, label in (
        ("time", "the day"), ("input", "input tokens"), ("output", "output tokens"), ("requests", "requests"),
        ("cost", "cost"), ("model", "the channel's model's lines only, by the model")) if at[figure] is not None]
    if beside:
        named.append("cache tokens counted beside the input from " + ", ".join(repr(header[i].strip())
                                                                              for i in beside))
    return "; ".join(named)


@dataclass
class StatementLine:
    day: str
    provider_requests: int | None
    provider_tokens: int
    provider_cost: str | None
    recorded_requests: int
    recorded_tokens: int
    recorded_cost: str
    estimated_rows: int  # rows whose figures the gateway estimated (clients that left before their usage)
    tokens_difference: float | None  # (recorded - provider) / provider, percent
    cost_difference: float | None
    words: str


def _percent(recorded, provider):
    if not provider:
        return None if not recorded else 100.0
    return 100.0 * (float(recorded) - float(provider)) / float(provider)


def statement_lines(channel, days):
    """A StatementLine per day of `days` ({date: DayFigures}), oldest first, against `channel`'s usage rows."""
    lines = []
    for day in sorted(days):
        provider = days[day]
        start = datetime(day.year, day.month, day.day, tzinfo=timezone.utc)
        rows = RequestLog.objects.filter(channel=channel, created_at__gte=start,
                                         created_at__lt=start + timedelta(days=1))
        sums = rows.aggregate(requests=Count("id", filter=Q(prompt_tokens__gt=0) | Q(completion_tokens__gt=0)),
                              prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"), cost=Sum("cost"),
                              estimated=Count("id", filter=Q(tokens_estimated__isnull=False)))
        tokens = (sums["prompt"] or 0) + (sums["completion"] or 0)
        cost = sums["cost"] or Decimal(0)
        tokens_difference = _percent(tokens, provider.tokens)
        cost_difference = None if provider.cost is None else _percent(cost, provider.cost)
        lines.append(StatementLine(
            day=day.isoformat(), provider_requests=provider.requests, provider_tokens=provider.tokens,
            provider_cost=None if provider.cost is None else str(provider.cost), recorded_requests=sums["requests"],
            recorded_tokens=tokens, recorded_cost=str(cost), estimated_rows=sums["estimated"],
            tokens_difference=tokens_difference, cost_difference=cost_difference,
            words=_words(tokens_difference, cost_difference, sums["estimated"])))
    return lines


def _over(value):
    return value is not None and abs(value) > TOLERANCE_PERCENT


def _words(tokens_difference, cost_difference, estimated):
    if not _over(tokens_difference) and not _over(cost_difference):
        return "agrees"
    if _over(tokens_difference):
        if tokens_difference < 0:
            cause = (f"the provider counted {-tokens_difference:.1f}% more tokens than the gateway recorded: "
                     "requests that used this provider key without the gateway, or usage the gateway could not "
                     "read")
        else:
            cause = (f"the gateway recorded {tokens_difference:.1f}% more tokens than the provider billed: figures "
                     "the gateway estimated for clients that left, or requests the provider did not bill")
        if estimated:
            cause += f" ({estimated} rows that day carry estimated figures)"
        return cause
    side = "more" if cost_difference > 0 else "less"
    return (f"the tokens agree but the gateway's cost is {abs(cost_difference):.1f}% {side} than the provider's: "
            "the channel's prices differ from what the provider charged (a price change, a discount, cached "
            "tokens priced differently)")


def statement_queue(*, team, channel, payload, file_name, user=None):
    """Check a provider's export for `channel` (a cloud channel of `team`) as a whole and queue its import: a
    StatementImport, read by a task on the default queue (statement_import_run). StatementError (nothing written)
    for a file that cannot be read at all; a bad cell is the import's failure, named by line and column."""
    from panel.dashboards.models import StatementImport

    if channel.team_id != team.pk or channel.kind != "remote":
        raise StatementError("Choose one of your team's cloud channels: a provider bills those.")
    text = export_check(payload)
    with transaction.atomic():
        job = StatementImport.objects.create(team=team, created_by=user, queue="default", channel=channel,
                                             channel_name=channel.name, file_name=file_name[:200], payload=text)
        job_created(job, actor=user, reason=f"upload of {job.file_name}")
        job_enqueue(job, "panel.dashboards.tasks.import_statement")
    return job


def statement_import_run(import_id, worker):
    """The task's body: read the queued export, compare it day by day, and save it as a ProviderStatement with, when
    any day differs, its `statement.mismatch` notification, in the transaction that ends the import. A redelivered
    task finds the import claimed and does nothing (None); a bad file fails the import, nothing saved."""
    from panel.dashboards.models import StatementImport

    job = StatementImport.objects.select_related("team", "channel").get(pk=import_id)
    if not job_claim(job, worker=worker):
        return None
    try:
        if job.channel is None:
            raise StatementError("The channel was deleted before its export was read.")
        parsed = export_parse(job.payload, model_id=job.channel.model_id)
        lines = statement_lines(job.channel, parsed.days)
    except StatementError as error:
        job_fail(job, kind="bad_file", reason=str(error), event="the file cannot be read")
        StatementImport.objects.filter(pk=job.pk).update(payload="")
        return None
    with transaction.atomic():
        statement = _statement_save(job, parsed, lines)
        if not job_succeed(job, result={"statement_id": statement.pk, "days": len(lines),
                                        "differing_days": statement.differing_days}):
            transaction.set_rollback(True)  # stopped meanwhile (the reaper): nothing saved
            return None
        StatementImport.objects.filter(pk=job.pk).update(statement=statement, payload="")
    return statement


def _statement_save(job, parsed, lines):
    from panel.dashboards.models import ProviderStatement
    from panel.notifications.models import EventKind
    from panel.notifications.services import notify

    team, channel = job.team, job.channel
    differing = [line for line in lines if line.words != "agrees"]
    statement = ProviderStatement.objects.create(
        team=team, channel=channel, channel_name=channel.name, file_name=job.file_name, uploaded_by=job.created_by,
        reading=parsed.reading, left_out=parsed.left_out, first_day=lines[0].day, last_day=lines[-1].day,
        differing_days=len(differing), lines=[line.__dict__ for line in lines])
    if differing:
        days = ", ".join(line.day for line in differing[:5]) + (" and more" if len(differing) > 5 else "")
        notify(team=team, kind=EventKind.STATEMENT_MISMATCH,
               title=f"{channel.name}: the provider's usage export differs from the usage rows on "
                     f"{len(differing)} of {len(lines)} days ({days}): {differing[0].words}",
               channel_id=channel.pk, statement_id=statement.pk,
               days=[line.day for line in differing],
               differences=[{"day": line.day, "tokens_percent": line.tokens_difference,
                             "cost_percent": line.cost_difference} for line in differing])
    return statement
