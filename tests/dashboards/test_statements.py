"""A provider's usage export against the usage rows: exports in OpenAI's and Anthropic's shapes read into the same
sums (cache tokens inside or beside the input, a model column, epoch or ISO times), every bad file refused by line
with nothing written, and a day where requests bypassed the gateway named, with its notification, after real
requests through the gateway and straight to the (fake) provider."""
import io
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import httpx
import pytest
from django.urls import reverse

from panel.audit.models import AuditAction, AuditEvent
from panel.dashboards.models import ProviderStatement, StatementImport
from panel.dashboards.statements import StatementError, export_parse, statement_import_run, statement_queue
from panel.notifications.models import Delivery, EventKind, Notification, Webhook
from panel.usage.models import RequestLog
from tests.support.gateway import (  # noqa: F401 (fixtures)
    CHAT,
    fallback,
    gateway,
    post,
    primary,
    records,
    route_to,
    setup,
)

ANTHROPIC = """day,user_type,user_id,user_name,provider,model,requests,input_tokens,output_tokens,cache_read_tokens,\
cache_write_5m_tokens,cache_write_1h_tokens,cost_micro_cents,cost_usd
2026-11-24,service_account,svc_1,ci,anthropic,claude-sonnet-4-5,10,1000,500,300,200,0,123,1.25
2026-11-24,service_account,svc_1,ci,anthropic,claude-sonnet-4-5-20250929,2,100,50,0,0,0,12,0.10
2026-11-24,member,user_2,ann,anthropic,claude-haiku-4-5,7,9999,9999,0,0,0,99,9.99
2026-11-25,service_account,svc_1,ci,anthropic,claude-sonnet-4-5,1,10,5,0,0,0,1,0.01
"""
EPOCH_24 = int(datetime(2026, 11, 24, tzinfo=timezone.utc).timestamp())
OPENAI = f"""start_time,end_time,input_tokens,output_tokens,input_cached_tokens,num_model_requests,model
{EPOCH_24},{EPOCH_24 + 3600},1000,200,400,3,gpt-4o-mini-2024-07-18
{EPOCH_24 + 3600},{EPOCH_24 + 7200},500,100,0,2,gpt-4o-mini
"""


def test_an_anthropic_export_counts_cache_tokens_beside_the_input_and_only_the_channels_model():
    parsed = export_parse(ANTHROPIC.encode(), model_id="claude-sonnet-4-5")
    day = parsed.days[date(2026, 11, 24)]
    assert (day.requests, day.tokens, day.cost) == (12, 1000 + 500 + 300 + 200 + 100 + 50, Decimal("1.35"))
    assert parsed.days[date(2026, 11, 25)].tokens == 15
    assert parsed.left_out == 1  # the haiku line
    assert "cache tokens counted beside the input from 'cache_read_tokens'" in parsed.reading


def test_an_openai_export_keeps_cached_tokens_inside_the_input_and_reads_epoch_hours_into_a_day():
    parsed = export_parse(OPENAI, model_id="gpt-4o-mini")
    [(day, figures)] = parsed.days.items()
    assert day == date(2026, 11, 24) and (figures.requests, figures.tokens, figures.cost) == (5, 1800, None)
    assert "cache" not in parsed.reading and "requests from 'num_model_requests'" in parsed.reading


@pytest.mark.parametrize("payload, words", [
    ("", "The file is empty"),
    ("date,tokens\n2026-11-24,5\n", "No column for input tokens; output tokens. Columns found: date, tokens"),
    ("date,input_tokens,output_tokens\n2026-11-24,1,2\nyesterday,1,2\n",
     "line 3, column date: 'yesterday' is not a date"),
    ("date,input_tokens,output_tokens\n2026-11-24,-1,2\n",
     "line 2, column input_tokens: '-1' is not a whole number of 0 or more (at most 15 digits)"),
    ("date,input_tokens,output_tokens\n2026-11-24,1.5,2\n", "line 2, column input_tokens: '1.5' is not a whole"),
    ("date,input_tokens,output_tokens\n2026-11-24,1,1234567890123456\n", "line 2, column output_tokens: '1234567"),
    ("date,input_tokens,output_tokens,Cost\n2026-11-24,1,2,NaN\n", "line 2, column Cost: 'NaN' is not an amount"),
    ("date,input_tokens,output_tokens,cost\n2026-11-24,1,2,1E5\n", "line 2, column cost: '1E5' is not an amount of 0 "
     "or more (digits, at most 15 before the point and 12 after it, without an exponent)"),
    ("date,input_tokens,output_tokens,cost\n2026-11-24,1,2,0.1234567890123\n", "line 2, column cost"),
    ("date,input_tokens,output_tokens\n", "a header but no lines"),
    ("date,model,input_tokens,output_tokens\n2026-11-24,other,1,2\n", "No line is for the channel's model 'm'"),
    (b"date,input_tokens\xff\n", "not UTF-8"),
])
def test_a_file_that_cannot_be_read_is_refused_by_line(payload, words):
    with pytest.raises(StatementError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        export_parse(payload, model_id="m")


def test_amounts_and_counts_may_have_thousands_commas_a_dollar_sign_and_decimals():
    parsed = export_parse('date,input_tokens,output_tokens,requests,cost\n2026-11-24,"1,000",2.0,3,"$1,234.50"\n'
                          "2026-11-24,,5,,.25\n", model_id="m")
    day = parsed.days[date(2026, 11, 24)]
    assert (day.tokens, day.requests, day.cost) == (1007, 3, Decimal("1234.75"))


def test_bypassed_requests_are_named_on_their_day_with_a_notification(gateway, setup, fallback, client):
    team, cloud = setup["team"], setup["cloud"]
    route_to(team, "cloud-only", cloud)
    hook = Webhook.objects.create(team=team, name="finance", url="http://127.0.0.1:9/hook", secret_ciphertext="x",
                                  secret_last4="xxxx", events=[EventKind.STATEMENT_MISMATCH])
    answers = [post(gateway, setup["raw"], {**CHAT, "model": "cloud-only"}).json() for _ in range(3)]
    rows = records(3)
    assert all(row.channel_id == cloud.pk for row in rows)
    direct = httpx.post(f"{fallback.base_url}/chat/completions", json={**CHAT, "model": "cloud-model"},
                        headers={"Authorization": "Bearer sk-cloud-1111"}, timeout=10).json()  # not through us
    billed = [answer["usage"] for answer in answers] + [direct["usage"]]
    today = rows[0].created_at.astimezone(timezone.utc).date()
    export = ("date,model,requests,input_tokens,output_tokens\n" + "\n".join(
        f"{today},cloud-model,1,{usage['prompt_tokens']},{usage['completion_tokens']}" for usage in billed)
        + f"\n{today - timedelta(days=1)},cloud-model,0,0,0\n")

    client.force_login(setup["vera"])  # a viewer sees statements but does not import them
    assert client.post(reverse("statement_upload"), {"channel": cloud.pk}).status_code == 403
    client.force_login(setup["alice"])
    bad = client.post(reverse("statement_upload"), {"channel": cloud.pk, "file": io.BytesIO(b"nonsense\n")})
    assert bad.status_code == 400 and "No column for a day or a time" in bad.content.decode()
    assert not ProviderStatement.objects.exists() and not Notification.objects.exists()
    local = client.post(reverse("statement_upload"), {"channel": setup["local"].pk,  # no provider bills it
                                                      "file": io.BytesIO(export.encode())})
    assert local.status_code == 400 and "Select a valid choice" in local.content.decode()
    assert not ProviderStatement.objects.exists()

    upload = io.BytesIO(export.encode())
    upload.name = "usage-november.csv"
    response = client.post(reverse("statement_upload"), {"channel": cloud.pk, "file": upload})
    job = StatementImport.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("statement_import_detail", args=[job.pk])
    waiting = client.get(response["Location"]).content.decode()
    assert "waiting for a worker" in waiting and 'data-live-url=' in waiting
    assert not ProviderStatement.objects.exists()  # the web process only checked the header and queued the import
    statement = statement_import_run(job.pk, "worker@test")  # the task's body, as the default queue's worker runs it
    assert statement == ProviderStatement.objects.get() and statement_import_run(job.pk, "worker@again") is None
    job.refresh_from_db()
    assert (job.state, job.statement, job.payload) == ("succeeded", statement, "")
    response = client.get(response["Location"])
    assert response.status_code == 302 and response["Location"] == reverse("statement_detail", args=[statement.pk])
    lines = {line["day"]: line for line in statement.lines}
    line = lines[today.isoformat()]
    provider_tokens = sum(usage["prompt_tokens"] + usage["completion_tokens"] for usage in billed)
    recorded = sum(row.prompt_tokens + row.completion_tokens for row in rows)
    assert (line["provider_requests"], line["recorded_requests"]) == (4, 3)
    assert (line["provider_tokens"], line["recorded_tokens"]) == (provider_tokens, recorded)
    assert line["tokens_difference"] == pytest.approx(100.0 * (recorded - provider_tokens) / provider_tokens)
    assert "requests that used this provider key without the gateway" in line["words"]
    assert lines[(today - timedelta(days=1)).isoformat()]["words"] == "agrees"  # nothing on either side
    assert statement.differing_days == 1
    note = Notification.objects.get(kind=EventKind.STATEMENT_MISMATCH)
    assert note.facts["statement_id"] == statement.pk and note.facts["days"] == [today.isoformat()]
    assert f"the provider's usage export differs from the usage rows on 1 of 2 days ({today})" in note.title
    assert Delivery.objects.get(notification=note).webhook == hook
    assert AuditEvent.objects.get(action=AuditAction.STATEMENT_IMPORTED).target == "cloud"
    page = client.get(response["Location"]).content.decode()
    assert "usage-november.csv" in page and f'data-day="{today}"' in page and "without the gateway" in page
    listing = client.get(reverse("statements")).content.decode()
    assert "1 day differs" in listing


def test_cost_that_differs_while_tokens_agree_names_the_prices(team_setup):
    from panel.channels.models import Channel

    team = team_setup["team_a"]
    cloud = Channel.objects.create(team=team, name="cloud", kind="remote", base_url="http://c/v1", model_id="m")
    at = datetime(2026, 11, 20, 12, tzinfo=timezone.utc)
    RequestLog.objects.create(team=team, channel=cloud, created_at=at, endpoint="chat", model="m", status_code=200,
                              outcome="ok", prompt_tokens=900, completion_tokens=100, latency_ms=1,
                              cost=Decimal("1.00"))
    job = statement_queue(team=team, channel=cloud, file_name="x.csv",
                          payload="date,input_tokens,output_tokens,cost\n2026-11-20,900,100,0.80\n")
    statement = statement_import_run(job.pk, "worker@test")
    [line] = statement.lines
    assert line["tokens_difference"] == 0 and line["cost_difference"] == pytest.approx(25.0)
    assert line["words"].startswith("the tokens agree but the gateway's cost is 25.0% more than the provider's")


def test_an_import_whose_worker_died_is_failed_by_the_reaper_and_never_imported_after(team_setup):
    from django.utils import timezone

    from panel.channels.models import Channel
    from panel.jobs.services import job_claim, jobs_reap

    cloud = Channel.objects.create(team=team_setup["team_a"], name="cloud", kind="remote", base_url="http://c/v1",
                                   model_id="m")
    job = statement_queue(team=team_setup["team_a"], channel=cloud, file_name="x.csv",
                          payload="date,input_tokens,output_tokens\n2026-11-20,900,100\n")
    assert job_claim(job, worker="worker@gone")  # the worker took it, then died
    StatementImport.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=10))
    assert [reaped.pk for reaped in jobs_reap(stale_after_seconds=60)] == [job.pk]
    job.refresh_from_db()
    assert job.state == "failed" and job.failure_kind == "worker_lost"
    assert statement_import_run(job.pk, "worker@later") is None and not ProviderStatement.objects.exists()
