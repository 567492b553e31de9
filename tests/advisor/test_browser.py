"""In Chromium: the advisor page with recommendations made from data that triggers them, following a link to the
object; a canary started from the route page, then rolled back, with the reason shown."""
from playwright.sync_api import expect

from panel.channels.canary import canary_check
from panel.channels.models import Channel, Route, RouteChannel
from panel.usage.models import RequestLog
from tests.support.advisor_objects import log, make_host, make_model, make_profile, serve
from tests.support.browser import screenshot, sign_in


def test_it_shows_advice_and_a_canary_that_rolls_back(page, live_server, team_setup, settings):
    team = team_setup["team_a"]
    parent = make_model(team)
    awq = make_model(team, "qwen-7b-awq-g256", parent=parent,
                     quantization={"method": "awq", "bits": 4, "group_size": 256})
    greedy = make_profile(team, parent, "greedy", gpu_memory_utilization=0.97, tensor_parallel_size=3)
    deployment, local = serve(team, make_profile(team, awq, "awq-h200", quantization="awq", quantization_bits=4),
                              host=make_host("h200"))
    log(team, 30, model="support", system_prompt_hash=lambda index: f"{index:016x}",
        system_prompt_shape_hash="f" * 16, prompt_tokens=400, cached_tokens=0)
    Channel.objects.create(team=team, name="cloud-down", base_url="http://no-such-host.invalid/v1",
                           model_id="m", last_test={"ok": False, "diagnosis": "the name does not resolve"})

    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.click("nav.sidebar >> text=Advisor")
    expect(page.locator("h1")).to_have_text("Advisor")
    items = page.locator(".advice-item")
    expect(items.filter(has_text="miss the prefix cache")).to_contain_text("came in 30 different versions")
    expect(items.filter(has_text="tensor_parallel_size 3")).to_contain_text("28 attention heads")
    expect(items.filter(has_text="gpu_memory_utilization 0.97")).to_contain_text("Set it to 0.90.")
    expect(items.filter(has_text="group size 256")).to_contain_text("AWQ 4-bit g256")
    expect(items.filter(has_text="memory to spare")).to_contain_text("141.0 GiB per GPU")
    expect(items.filter(has_text="cloud-down is failing")).to_contain_text("the name does not resolve")
    expect(page.locator(".advice-item.problem").first).to_be_visible()
    screenshot(page, "advisor")
    items.filter(has_text="gpu_memory_utilization 0.97").locator("a.btn").click()
    expect(page.locator("h1")).to_contain_text("greedy")
    assert page.url.endswith(f"/serving/profiles/{greedy.pk}/")

    cloud = Channel.objects.create(team=team, name="cloud", base_url="http://127.0.0.1:9/v1", model_id="m")
    route = Route.objects.create(team=team, model_name="support")
    RouteChannel.objects.create(route=route, channel=cloud, position=0)
    page.goto(f"{live_server.url}/channels/")
    page.click(f"a[href='/channels/routes/{route.pk}/']")
    page.select_option("#id_channel", str(local.pk))
    page.check("#id_auto")
    page.click("button:has-text('Start canary')")
    expect(page.locator(".card").first).to_contain_text("5% of the requests go to")

    def answered(channel, count, *, canary, latency, valid=True):
        RequestLog.objects.bulk_create([RequestLog(team=team, route=route, channel=channel, canary=canary,
                                                   endpoint="chat", model="support", status_code=200, outcome="ok",
                                                   latency_ms=latency, json_requested=True, json_valid=valid)
                                        for _ in range(count)])

    answered(local, 36, canary=True, latency=180)
    answered(cloud, 600, canary=False, latency=240)
    assert canary_check(route=Route.objects.get(pk=route.pk)) == "watching"  # clean; the step lasts 10 min
    page.reload()
    expect(page.locator("table.guards")).to_contain_text("0 of 36")
    screenshot(page, "route-canary-running")

    answered(local, 4, canary=True, latency=180, valid=False)
    assert canary_check(route=Route.objects.get(pk=route.pk)) == "rolled_back"
    page.reload()
    expect(page.locator(".message.error")).to_contain_text("JSON parse failures 10.0% (4 of 40")
    screenshot(page, "route-canary-rolled-back")
    page.click("nav.sidebar >> text=Advisor")
    expect(page.locator(".advice-item").filter(has_text="was rolled back")).to_contain_text("3-point threshold")
