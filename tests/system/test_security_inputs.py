"""Attack tests for what a team's input can make a shared process do: a regular expression that backtracks for ever
(a traffic sample's redaction, an evaluation's regex check and JSON Schema patterns, a quantization's `re:` keep
pattern), and a provider statement whose numbers take seconds to convert."""
import json
import time

import pytest
from django.urls import reverse

from panel.evaluations.checks import check_problems, run_check
from panel.registry.models import QuantizationJob
from panel.usage import samples
from tests.registry.test_quality import checkpoint, model  # noqa: F401 (fixtures)

# \w* repeated, then a character the text lacks: a backtracking engine tries every way of splitting the text among
# the repetitions (Python's re: seconds at 32 characters and a few dozen letters, never at 100 or 5,000 letters).
SHORT = r"\w*" * 10 + "#"
LONG = r"\w*" * 33 + "#"
TEXT = "a" * 5000
BOUND_SECONDS = 1.0


def timed(function, *args):
    started = time.monotonic()
    result = function(*args)
    return result, time.monotonic() - started


@pytest.mark.parametrize("pattern", [SHORT, LONG])
def test_a_redaction_pattern_that_would_backtrack_runs_in_linear_time(pattern):
    assert samples.redaction_problems(pattern) == []  # accepted at save, and safe to run
    plan = samples.SamplePlan(route_id=1, team_id=1, per_day=1, redactions=(pattern,))
    (text, count), seconds = timed(samples.redact, TEXT, samples.patterns_for(plan))
    assert (text, count) == (TEXT, 0) and seconds < BOUND_SECONDS


@pytest.mark.parametrize("pattern", [SHORT, LONG])
def test_a_regex_check_that_would_backtrack_runs_in_linear_time(pattern):
    spec = {"type": "regex", "pattern": pattern}
    assert check_problems(spec) == []
    result, seconds = timed(run_check, spec, TEXT)
    assert not result.passed and seconds < BOUND_SECONDS


@pytest.mark.parametrize("pattern", [SHORT, LONG])
def test_a_schema_pattern_that_would_backtrack_runs_in_linear_time(pattern):
    spec = {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "string",
                                                                                      "pattern": pattern}}}}
    assert check_problems(spec) == []
    result, seconds = timed(run_check, spec, json.dumps({"a": TEXT}))
    assert not result.passed and result.words.startswith("at $.a: 'aaa") and seconds < BOUND_SECONDS


@pytest.mark.parametrize("pattern", [SHORT, LONG])
def test_schema_pattern_properties_that_would_backtrack_run_in_linear_time(pattern):
    spec = {"type": "json_schema", "schema": {"type": "object", "patternProperties": {pattern: {"type": "integer"}},
                                              "additionalProperties": False}}
    assert check_problems(spec) == []
    result, seconds = timed(run_check, spec, json.dumps({TEXT: 1}))
    assert not result.passed and seconds < BOUND_SECONDS


@pytest.mark.parametrize("pattern, words", [
    (r"(a)\1", "refers back to a group"),
    (r"(?=a)b", "looks ahead or behind"),
    (r"(?<!x)y", "looks ahead or behind"),
])
def test_a_pattern_the_engine_cannot_run_is_refused_at_save_in_every_place(pattern, words):
    assert any(words in problem for problem in samples.redaction_problems(pattern))
    assert any(words in problem for problem in check_problems({"type": "regex", "pattern": pattern}))
    schema = {"type": "json_schema", "schema": {"properties": {"a": {"pattern": pattern}}}}
    assert any(words in problem for problem in check_problems(schema))


def test_a_quantization_keep_pattern_that_would_backtrack_runs_in_linear_time(client, team_setup, model):  # noqa: F811
    client.force_login(team_setup["alice"])
    data = {"scheme": "mixed", "q_group_size": 128, "calibration": "builtin", "max_calib_samples": 32,
            "max_calib_seq_len": 256, "keep_as": "bf16", "version": "GEMM", "keep_patterns": "re:" + LONG}
    response, seconds = timed(client.post, reverse("quantization_create", args=[model.pk]), data)
    assert response.status_code == 400 and "names no linear layer" in response.content.decode()
    assert seconds < 5 * BOUND_SECONDS and not QuantizationJob.objects.exists()  # a whole page, not one search
    refused = client.post(reverse("quantization_create", args=[model.pk]), dict(data, keep_patterns=r"re:(a)\1"))
    assert refused.status_code == 400 and "refers back to a group" in refused.content.decode()


# --- a provider statement's numbers ---------------------------------------------------------------------------------

EXPONENT_COST = b"day,input_tokens,output_tokens,cost\n1,1,1,1e200000\n"  # 52 bytes: about 1 s of the web process
EXPONENT_TOKENS = "date,input_tokens,output_tokens\n2026-11-24,1e1000000,2\n"  # about 28 s for the one cell


def test_a_statement_with_a_huge_exponent_in_a_cell_is_refused_fast_naming_line_and_column():
    from panel.dashboards.statements import StatementError, export_parse

    for payload, where in ((EXPONENT_COST, "line 2, column cost"), (EXPONENT_TOKENS, "line 2, column input_tokens")):
        started = time.monotonic()
        with pytest.raises(StatementError, match=where):
            export_parse(payload, model_id="m")
        assert time.monotonic() - started < BOUND_SECONDS


def test_a_statement_upload_is_read_by_a_task_and_a_bad_cell_writes_nothing(client, team_setup,
                                                                            django_capture_on_commit_callbacks):
    from panel.channels.models import Channel
    from panel.dashboards.models import ProviderStatement, StatementImport
    from panel.dashboards.statements import statement_import_run

    team = team_setup["team_a"]
    cloud = Channel.objects.create(team=team, name="cloud", kind="remote", base_url="http://c/v1", model_id="m")
    client.force_login(team_setup["alice"])
    for payload, words in ((EXPONENT_COST, "line 2, column cost: '1e200000' is not an amount"),
                           (EXPONENT_TOKENS.encode(), "line 2, column input_tokens: '1e1000000' is not a whole")):
        with django_capture_on_commit_callbacks(execute=False) as queued:
            response, seconds = timed(client.post, reverse("statement_upload"),
                                      {"channel": cloud.pk, "file": _upload(payload)})
        job = StatementImport.objects.latest("pk")
        assert response.status_code == 302 and seconds < BOUND_SECONDS and len(queued) == 1  # the web process queues
        assert response["Location"] == reverse("statement_import_detail", args=[job.pk])
        _, seconds = timed(statement_import_run, job.pk, "worker@test")
        job.refresh_from_db()
        assert seconds < BOUND_SECONDS and job.state == "failed" and not ProviderStatement.objects.exists()
        assert job.failure_reason.startswith(words) and job.payload == ""
        page = client.get(response["Location"]).content.decode()
        assert "Nothing was imported. What is wrong: " + words.split(":")[0] in page
        assert statement_import_run(job.pk, "worker@again") is None  # a redelivered task does nothing
    overview = client.get(reverse("home")).content.decode()  # the overview lists the failure with its page
    assert f"Statement import #{job.pk} failed" in overview and response["Location"] in overview


def _upload(content):
    import io

    upload = io.BytesIO(content)
    upload.name = "usage.csv"
    return upload
