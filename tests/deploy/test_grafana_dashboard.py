"""The Grafana dashboard (deploy/grafana/tokenwise.json): every query is PromQL that parses, and every metric it
names is one the panel's /metrics serves (scraped here) or vLLM exports (tests/deploy/vllm_metrics.txt, read from
the engine's vllm)."""
import json
import re
from pathlib import Path

import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

BASE = Path(__file__).resolve().parents[2]
DASHBOARD = BASE / "deploy" / "grafana" / "tokenwise.json"
VLLM_METRICS = Path(__file__).with_name("vllm_metrics.txt")
# Grafana's own variables and the dashboard's, as Grafana would substitute them before Prometheus sees the query.
GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "6h", "model": ".*", "engine_model": ".*"}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "info": ("_info",), "summary": ("", "_sum", "_count", "_created")}


def series_names(family, kind):
    """The names a prometheus_client family of this kind writes at /metrics (a counter `x` or `x_total`: x_total)."""
    if kind == "counter":
        family = family.removesuffix("_total")
    return {family + suffix for suffix in SUFFIXES[kind]}


def vllm_names():
    text = VLLM_METRICS.read_text()
    version = re.search(r"vLLM (\d+\.\d+\.\d+)", text).group(1)
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            family, kind = line.split()
            names |= series_names(family, kind)
    return version, names


def substituted(expr):
    def value(match):
        name = match.group(1) or match.group(2)
        assert name in GRAFANA_VARIABLES, f"unknown variable ${name} in {expr!r}"
        return GRAFANA_VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def metric_names(expr):
    """The metric names a PromQL expression selects, read from its syntax tree; a selector without a name fails."""
    names = set()

    def walk(node):
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr!r}"
            names.add(node.name)
        elif isinstance(node, promql_parser.MatrixSelector):
            walk(node.vector_selector)
        elif isinstance(node, promql_parser.BinaryExpr):
            walk(node.lhs)
            walk(node.rhs)
        elif isinstance(node, promql_parser.Call):
            for argument in node.args:
                walk(argument)
        elif isinstance(node, (promql_parser.AggregateExpr, promql_parser.ParenExpr, promql_parser.UnaryExpr,
                               promql_parser.SubqueryExpr)):
            walk(node.expr)
            if getattr(node, "param", None) is not None:
                walk(node.param)
        else:
            assert isinstance(node, (promql_parser.NumberLiteral, promql_parser.StringLiteral)), node

    walk(promql_parser.parse(substituted(expr)))
    return names


def panels(dashboard):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard):
    """(where, PromQL) for every panel target and every query variable (label_values(metric, label))."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            metric = re.fullmatch(r"label_values\(([^,]+), *\w+\)", variable["definition"]).group(1)
            yield f"variable {variable['name']}", metric


def unexported(dashboard, exported):
    return {where: sorted(metric_names(expr) - exported) for where, expr in queries(dashboard)
            if metric_names(expr) - exported}


@pytest.fixture
def panel_names(client, settings, db):
    """The names the panel's /metrics serves, scraped as Prometheus would."""
    settings.METRICS_TOKEN = "grafana-test"
    answer = client.get("/metrics", HTTP_AUTHORIZATION="Bearer grafana-test")
    assert answer.status_code == 200
    names = set()
    for family in text_string_to_metric_families(answer.content.decode()):
        names |= series_names(family.name, family.type)
    return names


@pytest.fixture
def dashboard():
    return json.loads(DASHBOARD.read_text())


def test_it_names_only_metrics_the_panel_or_vllm_exports(dashboard, panel_names):
    version, engine_names = vllm_names()
    assert version == "0.32.0"  # the engine venv's and the gpu-worker image's vLLM (Dockerfile)
    assert {"tokenwise_gateway_requests_total", "tokenwise_gateway_cost_total",
            "tokenwise_gateway_time_to_first_token_seconds_bucket"} <= panel_names
    assert unexported(dashboard, panel_names | engine_names) == {}
    named = set().union(*(metric_names(expr) for _, expr in queries(dashboard)))
    # the panels the issue asks for: gateway requests, TTFT, errors, cost; vLLM's TTFT, queue, KV cache, prefix
    # cache and tokens
    assert {"tokenwise_gateway_requests_total", "tokenwise_gateway_time_to_first_token_seconds_bucket",
            "tokenwise_gateway_errors_total", "tokenwise_gateway_cost_total", "vllm:time_to_first_token_seconds_bucket",
            "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total",
            "vllm:prefix_cache_queries_total", "vllm:generation_tokens_total"} <= named


def test_it_finds_a_query_that_names_a_metric_nobody_exports(dashboard, panel_names):
    _, engine_names = vllm_names()
    target = next(panel for panel in panels(dashboard) if panel["title"] == "KV-cache usage")["targets"][0]
    target["expr"] = target["expr"].replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # vLLM < 0.10
    dashboard["panels"][0]["panels"].append({"title": "typo", "targets": [
        {"refId": "A", "expr": "sum(rate(tokenwise_gateway_request_total[5m])) / on() group_left sum(up)"}]})
    assert unexported(dashboard, panel_names | engine_names) == {
        "panel 'KV-cache usage' A": ["vllm:gpu_cache_usage_perc"],
        "panel 'typo' A": ["tokenwise_gateway_request_total", "up"],
    }


def test_it_reads_metric_names_from_the_syntax_tree():
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(a_bucket{model=~"$model", le!="x"}'
                        '[$__rate_interval]))) / ignoring(le) b - -c offset 5m') == {"a_bucket", "b", "c"}
    assert metric_names("max_over_time(d[1h:5m]) > bool 3") == {"d"}
    with pytest.raises(AssertionError, match="without a metric name"):
        metric_names('sum(rate({__name__=~"tokenwise_.*"}[5m]))')
    with pytest.raises(ValueError):
        metric_names("sum(rate(x[5m])")


def test_it_is_a_dashboard_grafana_imports(dashboard):
    assert dashboard["uid"] == "tokenwise" and dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"] and panel["gridPos"]["w"] <= 24, panel["title"]


def test_it_counts_what_requests_cost_for_the_cost_panels(client, settings, db):
    from decimal import Decimal

    from panel.gateway import metrics

    for cost in (Decimal("0.0125"), Decimal("0.0250")):
        metrics.gateway_request_observe(fields={"endpoint": "chat", "model": "m-cost", "outcome": "ok",
                                                "prompt_tokens": 10, "completion_tokens": 5, "cost": cost,
                                                "latency_ms": 20}, fell_back=False)
    metrics.gateway_request_observe(fields={"endpoint": "chat", "model": "m-cost", "outcome": "error",
                                            "error_kind": "upstream_5xx", "latency_ms": 5}, fell_back=False)
    settings.METRICS_TOKEN = "grafana-test"
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer grafana-test").content.decode()
    (value,) = re.findall(r'^tokenwise_gateway_cost_total\{model="m-cost"\} (\S+)$', text, re.M)
    assert float(value) == pytest.approx(0.0375)
