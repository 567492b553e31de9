"""In Chromium: each dashboard tab draws its charts with data (not empty figures), the page refreshes itself with
new traffic without a reload, and an empty team gets the explanation. Screenshots in docs/screenshots/."""
from datetime import timedelta

from django.utils import timezone
from playwright.sync_api import expect

from panel.dashboards.models import EngineSample
from panel.dashboards.rollup import usage_rollup_run
from panel.dashboards.seed import usage_seed, usage_seed_fixtures
from tests.support.browser import screenshot, sign_in
from tests.support.dashboards import figure_points, seed_engine

FIGURES = {"": ("requests", "tokens", "errors"), "latency/": ("ttft", "itl", "latency"),
           "cache/": ("hit_rate", "kv", "cached_share"), "cost/": ("per_million", "savings")}


def test_it_draws_every_tab_with_data_and_refreshes_without_a_reload(page, live_server, team_setup):
    team = team_setup["team_a"]
    local, _, _ = usage_seed_fixtures(team=team)
    usage_seed(team=team, count=4000, days=1)
    seed_engine(local.deployment)
    usage_rollup_run()
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.click("nav.sidebar >> text=Dashboards")
    for path, names in FIGURES.items():
        page.goto(f"{live_server.url}/dashboards/{path}?range=24h")
        for name in names:
            page.wait_for_function("(name) => document.getElementById('figure-' + name)?.data !== undefined", arg=name)
            assert figure_points(page, name) > 0, (path, name)
        expect(page.locator(".dash-figure .main-svg").first).to_be_visible()
        screenshot(page, f"dashboards-{path.strip('/') or 'overview'}")

    # Live refresh: new traffic is rolled up, and the open page shows it without a reload.
    page.goto(f"{live_server.url}/dashboards/?range=1h")
    page.wait_for_function("document.getElementById('figure-requests')?.data !== undefined")
    before = page.locator("#dash-cards .stat-value").first.inner_text()
    page.evaluate("window.__same_page = true")
    usage_seed(team=team, count=300, days=30 / 86400, seed=9)
    usage_rollup_run()
    page.wait_for_function("Number(document.getElementById('dash-figures').dataset.refreshes || 0) >= 1",
                           timeout=20000)
    expect(page.locator("#dash-cards .stat-value").first).not_to_have_text(before)
    assert page.evaluate("window.__same_page") is True  # no reload happened
    expect(page.locator("#dash-status")).to_contain_text("updated")


def test_it_explains_how_data_will_appear_for_an_empty_team(page, live_server, team_setup):
    sign_in(page, live_server.url, "bob", "pw-bob-123")
    page.goto(f"{live_server.url}/dashboards/cost/")
    expect(page.locator("#dash-empty h2")).to_have_text("No traffic from this team yet")
    expect(page.locator("#dash-empty")).to_contain_text("rolled up per minute")
    screenshot(page, "dashboards-empty")


TIME_FIGURES = {"": ("requests", "tokens", "errors"), "latency/": ("ttft", "itl", "latency"),
                "cache/": ("hit_rate", "kv", "cached_share")}


def seed_engine_month(deployment, days=30):
    """What a month of scrapes leaves after compaction: one row an hour (the last hour raw, from seed_engine)."""
    now = timezone.now()
    EngineSample.objects.bulk_create([EngineSample(
        deployment=deployment, team_id=deployment.team_id, at=now - timedelta(hours=h), seconds=3600, period=3600,
        prefix_queries=40000, prefix_hits=10000 + 400 * (h % 50), prompt_tokens=40000, generation_tokens=9000,
        kv_cache_usage=0.3, running=3, waiting=0,
        ttft={"le": {"0.05": 20, "0.1": 60, "+Inf": 100}, "count": 100, "sum": 9},
        itl={"le": {"0.01": 500, "0.025": 950, "+Inf": 1000}, "count": 1000, "sum": 14}) for h in range(2, days * 24)])


def figure_traces(page, name):
    """[(trace name, points with a value)] of one figure."""
    return page.evaluate("""(name) => document.getElementById('figure-' + name).data.map(
        (trace) => [trace.name, (trace.y || []).filter((y) => y !== null && y !== undefined).length])""", name)


def tick_labels(page, name):
    return page.evaluate("""(name) => [...document.querySelectorAll('#figure-' + name + ' .xtick text')].map(
        (node) => node.textContent)""", name)


def test_every_range_draws_lines_with_readable_ticks_for_a_young_and_an_old_team(page, live_server, team_setup):
    """The 24 h range once drew one dot per series and ticks like 16:59:59.9995 for data a few minutes old."""
    import re

    old, young = team_setup["team_a"], team_setup["team_b"]
    local, _, _ = usage_seed_fixtures(team=old)
    usage_seed(team=old, count=3000, days=30)
    seed_engine(local.deployment)
    seed_engine_month(local.deployment)
    young_local, _, _ = usage_seed_fixtures(team=young)
    usage_seed(team=young, count=600, days=1 / 24, seed=3)  # the team's first request was an hour ago
    seed_engine(young_local.deployment, minutes=60)
    usage_rollup_run()
    for user, password in (("alice", "pw-alice-123"), ("bob", "pw-bob-123")):
        page.context.clear_cookies()
        sign_in(page, live_server.url, user, password)
        for range_ in ("1h", "24h", "7d", "30d"):
            for path, names in TIME_FIGURES.items():
                page.goto(f"{live_server.url}/dashboards/{path}?range={range_}")
                for name in names:
                    page.wait_for_function(
                        "(name) => document.querySelector('#figure-' + name + ' .xtick text') !== null", arg=name)
                    traces = figure_traces(page, name)
                    drawn = [points for _, points in traces if points]
                    assert drawn, (user, range_, name, traces)
                    assert min(drawn) >= 2, (user, range_, name, traces)  # a line, never a lone dot
                    labels = tick_labels(page, name)
                    assert len(labels) >= 3, (user, range_, name, labels)
                    assert not [label for label in labels if re.search(r"\d:\d\d\.\d", label)], labels
        if user == "bob":
            page.goto(f"{live_server.url}/dashboards/?range=24h")
            page.wait_for_function("document.querySelector('#figure-requests .xtick text') !== null")
            screenshot(page, "dashboards-young-team-24h")


def tables_overflowing(page):
    """Dashboard tables wider than their box (cut off behind a horizontal scroll)."""
    return page.evaluate("""() => [...document.querySelectorAll('.dash-table')].filter((section) => {
        const wrap = section.querySelector('.table-wrap');
        return wrap && wrap.scrollWidth > wrap.clientWidth + 1; }).map((section) => section.dataset.table)""")


def test_the_cost_tab_says_local_cost_is_unknown_without_a_gpu_price_and_prints_money(page, live_server,
                                                                                       team_setup):
    import re

    from panel.channels.models import Channel
    from panel.hosts.models import WorkerHost

    team = team_setup["team_a"]
    local, clouds, _ = usage_seed_fixtures(team=team)
    Channel.objects.filter(pk=clouds[0].pk).update(enabled=True)  # a cloud channel the team could fall back on
    usage_seed(team=team, count=400, days=1)
    seed_engine(local.deployment)
    usage_rollup_run()
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    # Every wide table fits a 1280 px window, on every tab.
    for path in ("", "latency/", "cache/", "cost/"):
        page.goto(f"{live_server.url}/dashboards/{path}?range=24h")
        expect(page.locator(".dash-table").first).to_be_visible()
        assert tables_overflowing(page) == [], path
    # Money with the currency's precision: never an exponent, on the page, in bars and in CSV.
    text = page.locator("main").inner_text()
    assert not re.search(r"\de-\d", text)
    bar_labels = page.evaluate("""() => document.getElementById('figure-savings').data
        .flatMap((trace) => trace.text || [])""")
    assert bar_labels and all(re.fullmatch(r"[\d,]+\.\d{2,8}", label) for label in bar_labels), bar_labels
    csv = page.request.get(f"{live_server.url}/dashboards/export.csv?tab=overview&range=24h&table=keys").text()
    assert "cost" in csv.splitlines()[0] and not re.search(r"\de-\d", csv)
    screenshot(page, "dashboards-cost")

    # Only local traffic while a cloud channel with prices exists: the cloud figure comes from that baseline.
    page.goto(f"{live_server.url}/dashboards/cost/?range=24h&channel={local.pk}")
    cloud = page.locator(".card", has_text="Cloud / 1M tokens")
    expect(cloud.locator(".stat-value")).not_to_have_text("—")
    expect(cloud).to_contain_text("prices for the local tokens")

    # No GPU price on the host: the local cost is unknown, and no savings are made up from a zero.
    WorkerHost.objects.filter(pk=local.deployment.host_id).update(gpu_price_per_hour=None)
    page.goto(f"{live_server.url}/dashboards/cost/?range=24h")
    card = page.locator(".card", has_text="Local / 1M tokens")
    expect(card.locator(".stat-value")).to_have_text("unknown")
    expect(card.get_by_role("link", name="Set a GPU price")).to_have_attribute("href", "/workers/")
    savings = page.locator(".card").filter(has=page.locator(".stat-label", has_text=re.compile("^Savings$")))
    expect(savings.locator(".stat-value")).to_have_text("unknown")
    expect(savings).to_contain_text("not computed: the local cost is unknown")
    table = page.locator(".dash-table[data-table=savings]")
    expect(table.locator("tr", has_text="savings %")).to_contain_text("unknown until a GPU price is set")
    expect(table.locator("tr", has_text="actual cost")).to_contain_text("unknown")
    assert Channel.objects.filter(team=team, kind="remote").exists()
    screenshot(page, "dashboards-cost-no-gpu-price")
