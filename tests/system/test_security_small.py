"""Attack tests for the smaller holes: CSV formulas in exports, unknown gateway paths that grew the usage table and
the metric labels, /metrics open on a panel reachable from elsewhere."""
import csv
import io

import httpx

from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.core.csv_cells import csv_cell
from panel.usage.models import RequestLog
from tests.support.environment import ROOT
from tests.support.gateway_server import GatewayServer


def test_csv_cells_that_start_a_formula_are_neutralised(client, team_setup):
    for start in ("=", "+", "-", "@", "\t", "\r"):
        assert csv_cell(start + "1+1") == "'" + start + "1+1"
    assert csv_cell(-1.5) == -1.5 and csv_cell("plain") == "plain" and csv_cell(None) == ""
    audit_record(action=AuditAction.REFUSED, team=team_setup["team_a"], actor=team_setup["alice"],
                 target="=HYPERLINK(\"http://attacker.example\",\"x\")")
    client.force_login(team_setup["alice"])
    rows = list(csv.reader(io.StringIO(client.get("/audit/export.csv").content.decode())))
    targets = [row[3] for row in rows[1:]]
    assert "'=HYPERLINK(\"http://attacker.example\",\"x\")" in targets
    assert not any(cell.startswith(("=", "+", "@")) for row in rows for cell in row)


def test_an_unknown_gateway_path_is_a_404_without_a_row_or_a_label(transactional_db):
    from django.db import connection

    server = GatewayServer(connection.settings_dict["NAME"])
    try:
        for index in range(5):
            answer = httpx.post(f"{server.url}/v1/flood-{index}", json={}, timeout=10)
            assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert "flood" not in metrics
    finally:
        server.stop()
    assert RequestLog.objects.count() == 0


def test_metrics_need_the_token_unless_made_public(client, settings):
    settings.METRICS_TOKEN, settings.METRICS_PUBLIC = "", True
    settings.PANEL_BIND = "0.0.0.0"
    assert client.get("/metrics").status_code == 200
    settings.METRICS_PUBLIC = False
    answer = client.get("/metrics")
    assert answer.status_code == 403 and "TOKENWISE_METRICS_TOKEN" in answer.content.decode()
    settings.METRICS_TOKEN = "s3cret-token"
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 200


def test_an_oversized_benchmark_is_refused_with_clear_errors(team_setup):
    from panel.benchmarks.forms import BenchmarkForm

    def errors(**values):
        data = {"workload": "synthetic", "input_tokens": 128, "output_tokens": 16, "requests": 10,
                "warmup_requests": 0, "concurrency": 4, **values}
        form = BenchmarkForm(data, team=team_setup["team_a"])
        assert not form.is_valid()
        return form.errors

    seen = errors(requests=10000, warmup_requests=100, input_tokens=32768, concurrency=1024)
    assert {"requests", "input_tokens", "concurrency"} <= set(seen)
    assert "at most" in " ".join(errors(requests=5000, input_tokens=16384)["input_tokens"])
    assert "input_tokens" not in errors(requests=100, input_tokens=1024)


def test_stored_upstream_words_are_redacted():
    from panel.benchmarks.services import summary_redacted

    summary = summary_redacted({"first_error": "HTTP 401: Incorrect API key provided: sk-live-0123456789abcdef"})
    assert "0123456789abcdef" not in summary["first_error"] and "sk-••••" in summary["first_error"]


def test_the_compose_web_service_trusts_forwarded_headers_only_from_configured_proxies():
    import yaml

    text = (ROOT / "compose.yaml").read_text()
    assert "forwarded-allow-ips='*'" not in text
    compose = yaml.safe_load(text)
    web = next(service for service in compose["services"].values()
               if "panel.web" in str(service.get("command", "")))
    assert "--forwarded-allow-ips=${TOKENWISE_TRUSTED_PROXIES}" in web["command"].replace("$$", "$")
    assert web["environment"]["TOKENWISE_TRUSTED_PROXIES"] == "${TOKENWISE_TRUSTED_PROXIES:-127.0.0.1}"
    assert web["environment"]["TOKENWISE_BIND"] == "0.0.0.0"  # so /metrics needs its token there
