"""The advisor: each rule fires on data made to trigger it and stays quiet otherwise; the system prompt hashes come
from real traffic through the gateway; the page lists recommendations with evidence, fix and link."""
from decimal import Decimal

import httpx
import pytest

from panel.accounts.keys import key_issue
from panel.advisor.services import advice
from panel.channels.canary import canary_rollback, canary_start
from panel.channels.models import Channel, Route, RouteChannel
from panel.gateway.fingerprint import mask, system_prompt_hashes
from panel.hosts.models import WorkerHost
from panel.serving.models import Deployment
from panel.usage.models import RequestLog
from tests.support.advisor_objects import log, make_host, make_model, make_profile, serve
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway_server import GatewayServer
from tests.support.waiting import wait_until


def fired(team, rule):
    return [item for item in advice(team=team) if item.rule == rule]


# ------------------------------------------------------------------------------------------------- hashing

def test_it_masks_timestamps_ids_and_names_but_keeps_the_words():
    masked = mask("You help ACME. Now: 2026-11-30T05:44:37Z. The user is Alice Smith, session "
                  "3f2a9c1e-1111-2222-3333-444455556666, order 12345, trace a3f9c2e1b7, request req_8f3k2j9x.")
    assert masked == ("You help ACME. Now: <datetime>. The user is <name>, session <uuid>, order <number>, "
                      "trace <hex_id>, request <id>.")
    assert mask("Today is Monday, November 30 at 5:44 PM. Hello, Dear Customer.") == \
        "Today is <date>, <date> <number> at <time>. Hello, <name>."
    assert mask("当前时间：2026年11月30日 13:45。用户：张三。") == "当前时间：<id> <time>。用户：<name>。"
    assert mask("Answer briefly. Use Markdown.") == "Answer briefly. Use Markdown."  # nothing dynamic
    one = system_prompt_hashes({"messages": [{"role": "system", "content": "Time: 10:15. User: Bob."},
                                             {"role": "user", "content": "hi"}]})
    two = system_prompt_hashes({"messages": [{"role": "system", "content": "Time: 11:42. User: Carol."}]})
    assert one["system_prompt_hash"] != two["system_prompt_hash"]
    assert one["system_prompt_shape_hash"] == two["system_prompt_shape_hash"]
    assert len(one["system_prompt_hash"]) == 16 and "Bob" not in str(one)
    assert system_prompt_hashes({"messages": [{"role": "user", "content": "no system prompt"}]}) == {}


@pytest.fixture
def gateway(transactional_db):
    from django.db import connection

    server = GatewayServer(connection.settings_dict["NAME"])
    yield server
    server.stop()


def test_it_finds_dynamic_system_prompts_and_cloud_429s_in_real_gateway_traffic(gateway, team_setup):
    team = team_setup["team_a"]
    with FakeUpstream(models=("m",)) as dynamic_fake, FakeUpstream(models=("m",), cached_tokens=90) as static_fake, \
            FakeUpstream(models=("m",)) as limited_fake, FakeUpstream(models=("m",)) as retried_fake:
        limited_fake.behave("status_429")
        for name, fake, retries in (("dynamic", dynamic_fake, 0), ("static", static_fake, 0),
                                    ("limited", limited_fake, 0), ("retried", retried_fake, 2)):
            channel = Channel.objects.create(team=team, name=name, kind="remote", base_url=fake.base_url,
                                             model_id="m", max_retries=retries, retry_backoff=1.0)
            route = Route.objects.create(team=team, model_name=name, strategy="priority")
            RouteChannel.objects.create(route=route, channel=channel, position=0)
        _, raw = key_issue(team=team, user=team_setup["alice"], name="app")
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {raw}"}) as client:
            for index in range(25):
                stamp = f"2026-11-30T{index % 24:02d}:{index:02d}:00Z"
                for model, system in (("dynamic", f"You are the support bot. Now: {stamp}. User: Name{index}x."),
                                      ("static", "You are the support bot. Answer briefly, in English.")):
                    messages = [{"role": "system", "content": system}, {"role": "user", "content": "hello there"}]
                    response = client.post(f"{gateway.url}/v1/chat/completions",
                                           json={"model": model, "messages": messages, "max_tokens": 5})
                    assert response.status_code == 200
            for _ in range(4):
                response = client.post(f"{gateway.url}/v1/chat/completions",
                                       json={"model": "limited", "messages": [{"role": "user", "content": "x"}]})
                assert response.status_code == 429
            for _ in range(4):  # a 429, then the retry gets through: the client never sees it
                retried_fake.behave("status_429", times=1, retry_after=0)
                response = client.post(f"{gateway.url}/v1/chat/completions",
                                       json={"model": "retried", "messages": [{"role": "user", "content": "x"}]})
                assert response.status_code == 200
    wait_until(lambda: RequestLog.objects.count() >= 58, seconds=15, message="58 usage records")
    assert set(RequestLog.objects.filter(model="retried").values_list("attempts", "rate_limited_attempts",
                                                                      "status_code")) == {(2, 1, 200)}
    assert set(RequestLog.objects.filter(model="limited").values_list("rate_limited_attempts", flat=True)) == {1}
    dynamic = RequestLog.objects.filter(model="dynamic")
    assert dynamic.values("system_prompt_hash").distinct().count() == 25
    assert dynamic.values("system_prompt_shape_hash").distinct().count() == 1
    assert RequestLog.objects.filter(model="static").values("system_prompt_hash").distinct().count() == 1

    [item] = fired(team, "dynamic_system_prompt")  # the static prompt, well cached, stays quiet
    assert item.key == "model:dynamic"
    assert "25 requests share one system prompt shape but it came in 25 different versions" in item.evidence[0]
    assert "cached tokens were 0%" in item.evidence[1] and "user message" in item.fix
    assert item.link == f"/channels/routes/{Route.objects.get(model_name='dynamic').pk}/"

    limited, retried = sorted(fired(team, "cloud_429"), key=lambda item: item.key)
    assert limited.key == f"route:{Route.objects.get(model_name='limited').pk}"
    assert "4 of 4 requests ended in 429 from limited" in limited.evidence[0]
    assert "max_retries to 3" in limited.fix and "local_first" in limited.fix
    # 429s the retries absorbed still count: the cloud is near its quota and the answers came late.
    assert retried.key == f"route:{Route.objects.get(model_name='retried').pk}"
    assert "4 of 4 requests met a 429 from retried; 0 ended in one" in retried.evidence[0]
    assert "max_retries to 3" in retried.fix and "retried: 2 retries" in retried.evidence[1]


# ------------------------------------------------------------------------------------------------- rules on data

@pytest.mark.django_db
def test_it_flags_rising_p99_only_with_a_large_max_num_seqs(team_setup):
    team = team_setup["team_a"]
    model = make_model(team)
    big = make_profile(team, model, "batchy", max_num_seqs=256)
    small = make_profile(team, model, "snappy", max_num_seqs=32)
    flat = make_profile(team, model, "steady", max_num_seqs=256)
    for profile, late_ttft in ((big, 1500.0), (small, 1500.0), (flat, 120.0)):
        _, channel = serve(team, profile)
        log(team, 60, channel=channel, ttft_ms=lambda index, late=late_ttft: 100.0 if index < 30 else late)
    [item] = fired(team, "p99_rising")
    assert item.key == f"profile:{big.pk}" and "from 100 ms to 1,500 ms" in item.evidence[0]
    assert "low-latency" in item.fix and item.link == f"/serving/profiles/{big.pk}/"


@pytest.mark.django_db
def test_it_flags_prefix_caching_off_only_where_requests_repeat_a_prefix(team_setup):
    team = team_setup["team_a"]
    model = make_model(team)
    off = make_profile(team, model, "nocache", enable_prefix_caching=False)
    on = make_profile(team, model, "cached", enable_prefix_caching=True)
    varied = make_profile(team, model, "varied", enable_prefix_caching=False)
    for profile, same in ((off, True), (on, True), (varied, False)):
        _, channel = serve(team, profile)
        log(team, 30, channel=channel,
            system_prompt_hash=lambda index, same=same: "a" * 16 if same else f"{index:016x}")
    [item] = fired(team, "prefix_caching_off")
    assert item.key == f"profile:{off.pk}" and "30 of 30 requests (100%)" in item.evidence[0]


@pytest.mark.django_db
def test_it_flags_a_tensor_parallel_size_that_does_not_divide_the_heads(team_setup):
    team = team_setup["team_a"]
    model = make_model(team, heads=28, kv_heads=4)
    bad = make_profile(team, model, "tp3", tensor_parallel_size=3)
    make_profile(team, model, "tp2", tensor_parallel_size=2)
    [item] = fired(team, "tensor_parallel")
    assert item.key == f"profile:{bad.pk}" and "28 attention heads and 4 KV heads" in item.evidence[0]
    assert "Use 1, 2 or 4" in item.fix


@pytest.mark.django_db
def test_it_flags_awq_group_size_256(team_setup):
    team = team_setup["team_a"]
    parent = make_model(team)
    coarse = make_model(team, "qwen-7b-awq-g256", parent=parent,
                        quantization={"method": "awq", "bits": 4, "group_size": 256})
    make_model(team, "qwen-7b-awq-g128", parent=parent, quantization={"method": "awq", "bits": 4, "group_size": 128})
    [item] = fired(team, "awq_group_256")
    assert item.key == f"model:{coarse.pk}" and "AWQ 4-bit g256" in item.evidence[0] and "128" in item.fix


@pytest.mark.django_db
def test_it_flags_gpu_memory_utilization_outside_the_stable_range(team_setup):
    team = team_setup["team_a"]
    model = make_model(team)
    high = make_profile(team, model, "greedy", gpu_memory_utilization=0.95)
    make_profile(team, model, "fine", gpu_memory_utilization=0.90)
    make_profile(team, model, "edge", gpu_memory_utilization=0.85)
    [item] = fired(team, "gpu_memory_utilization")
    assert item.key == f"profile:{high.pk}" and "0.95" in item.evidence[0]
    assert "0.85-0.92" in item.fix and item.fix.endswith("Set it to 0.90.")


@pytest.mark.django_db
def test_it_flags_weight_only_awq_only_on_a_gpu_with_memory_to_spare(team_setup):
    team = team_setup["team_a"]
    parent = make_model(team)
    awq = make_model(team, "qwen-7b-awq", parent=parent, quantization={"method": "awq", "bits": 4, "group_size": 128})
    roomy, _ = serve(team, make_profile(team, awq, "awq-h200", quantization="awq", quantization_bits=4),
                     host=make_host("h200", gpu_gib=141))
    serve(team, make_profile(team, awq, "awq-24g", quantization="awq", quantization_bits=4),
          host=make_host("l4", gpu_gib=24))
    serve(team, make_profile(team, awq, "awq-cpu", quantization="awq", quantization_bits=4),
          host=make_host("cpu", kind="default"))
    serve(team, make_profile(team, parent, "fp16-h200"), host=make_host("h200b", gpu_gib=141))
    [item] = fired(team, "awq_spare_memory")
    assert item.key == f"deployment:{roomy.pk}" and "141.0 GiB per GPU" in item.evidence[0]
    assert "0.90 × 141.0 GiB = 126.9 GiB" in item.evidence[0] and "14.2 GiB" in item.evidence[1]
    assert "slower than FP16 or FP8" in item.fix


@pytest.mark.django_db
def test_it_stays_quiet_without_triggers_and_reports_a_rolled_back_canary(team_setup):
    team = team_setup["team_a"]
    model = make_model(team)
    profile = make_profile(team, model, "tidy", max_num_seqs=64, gpu_memory_utilization=0.9)
    _, channel = serve(team, profile)
    log(team, 40, channel=channel, ttft_ms=100.0, system_prompt_hash=lambda index: f"{index:016x}",
        system_prompt_shape_hash=lambda index: f"{index:016x}", cached_tokens=80)
    assert advice(team=team) == []
    assert advice(team=team_setup["team_b"]) == []

    cloud = Channel.objects.create(team=team, name="cloud", base_url="http://127.0.0.1:9/v1", model_id="m",
                                   price_input_per_million=Decimal("1"))
    route = Route.objects.create(team=team, model_name="chat")
    RouteChannel.objects.create(route=route, channel=channel, position=0)
    reason = "JSON parse failures 8.0% are above the 3% threshold."
    canary_rollback(route=canary_start(route=route, channel=cloud), reason=reason)
    [item] = advice(team=team)
    assert (item.rule, item.evidence) == ("canary_rolled_back", [reason])


@pytest.mark.django_db
def test_it_flags_a_local_deployment_dearer_than_the_cloud_and_not_a_busy_one(team_setup):
    from datetime import timedelta

    from django.utils import timezone

    from panel.dashboards.rollup import usage_rollup_run

    team = team_setup["team_a"]
    model = make_model(team)
    cloud = Channel.objects.create(team=team, name="taotoken", base_url="http://127.0.0.1:9/v1", model_id="m",
                                   price_input_per_million=Decimal("1"), price_output_per_million=Decimal("2"))
    idle, idle_channel = serve(team, make_profile(team, model, "idle"), host=make_host("h200", gpu_gib=141))
    busy, busy_channel = serve(team, make_profile(team, model, "busy"), host=make_host("h200b", gpu_gib=141))
    WorkerHost.objects.filter(host="h200").update(gpu_price_per_hour=Decimal("2.00"))
    WorkerHost.objects.filter(host="h200b").update(gpu_price_per_hour=Decimal("0.01"))
    Deployment.objects.filter(pk__in=[idle.pk, busy.pk]).update(ready_at=timezone.now() - timedelta(hours=10))
    log(team, 40, channel=idle_channel, prompt_tokens=250)  # 10,000 tokens in 10 hours at 2.00 an hour
    log(team, 100, channel=busy_channel, prompt_tokens=10_000)  # 1M tokens in 10 hours at 0.01 an hour
    log(team, 5, channel=cloud, prompt_tokens=100)
    usage_rollup_run(lock=False)
    [item] = fired(team, "local_dearer")
    assert item.key == f"deployment:{idle.pk}" and item.severity == "problem"
    assert f"{idle_channel.name} costs 2000." in item.title and "× what taotoken would charge" in item.title
    assert "10.0 hours up at 2.00 an hour = 20.00 for 10,000 tokens: 2,000.0" in item.evidence[0]
    assert "taotoken would have charged 0.01: 1.00 per 1M tokens" in item.evidence[1]
    assert "cheaper than the cloud above 2,000,000" in item.evidence[2]
    assert "let the route fall back to the cloud channel" in item.fix
    assert item.link == f"/serving/deployments/{idle.pk}/"
    assert fired(team, "idle_deployment") == []  # both served something

    spare, _ = serve(team, make_profile(team, model, "spare"), host=make_host("h200c", gpu_gib=141))
    WorkerHost.objects.filter(host="h200c").update(gpu_price_per_hour=Decimal("0.50"))
    Deployment.objects.filter(pk=spare.pk).update(ready_at=timezone.now() - timedelta(hours=10))
    [item] = fired(team, "idle_deployment")
    assert item.key == f"deployment:{spare.pk}" and "served nothing in the last 24 h" in item.title
    assert item.evidence[0].startswith("10.0 hours up at 0.50 an hour = 5.0") and "for 0 requests" in item.evidence[0]


@pytest.mark.django_db
def test_it_flags_a_failing_channel_from_its_attempts_or_its_last_test(team_setup):
    team = team_setup["team_a"]
    dns = Channel.objects.create(team=team, name="cloud-dns", base_url="http://no-such-host.invalid/v1", model_id="m")
    flaky = Channel.objects.create(team=team, name="cloud-flaky", base_url="http://127.0.0.1:9/v1", model_id="m")
    tested = Channel.objects.create(team=team, name="cloud-tested", base_url="http://127.0.0.1:9/v1", model_id="m",
                                    last_test={"ok": False, "kind": "connection",
                                               "diagnosis": "no-such-host.invalid does not resolve"})
    fine = Channel.objects.create(team=team, name="cloud-fine", base_url="http://127.0.0.1:9/v1", model_id="m",
                                  last_test={"ok": True})
    # Six requests fell back past the DNS failure to a channel that answered; the flaky one failed 5 of 25.
    log(team, 6, channel=fine, attempts=2, fell_back=True, attempt_trail=[
        {"channel": "cloud-dns", "channel_id": dns.pk, "outcome": "connection"},
        {"channel": "cloud-fine", "channel_id": fine.pk, "outcome": "ok"}])
    log(team, 5, channel=flaky, attempts=2, attempt_trail=[
        {"channel": "cloud-flaky", "channel_id": flaky.pk, "outcome": "upstream_error"},
        {"channel": "cloud-flaky", "channel_id": flaky.pk, "outcome": "ok"}])
    log(team, 20, channel=flaky)
    found = {item.key: item for item in fired(team, "channel_failing")}
    assert set(found) == {f"channel:{dns.pk}", f"channel:{tested.pk}"}
    assert found[f"channel:{dns.pk}"].evidence == [
        "6 attempts failed (6 could not connect); it answered 0 requests"]
    assert found[f"channel:{tested.pk}"].evidence == [
        "its last Test failed: no-such-host.invalid does not resolve"]
    assert found[f"channel:{dns.pk}"].link == f"/channels/{dns.pk}/" and "press Test" in found[f"channel:{dns.pk}"].fix


@pytest.mark.django_db
def test_it_shows_the_advisor_page_to_every_role(client, team_setup):
    team = team_setup["team_a"]
    make_profile(team, make_model(team), "greedy", gpu_memory_utilization=0.97)
    client.force_login(team_setup["vera"])  # a viewer reads the advice too
    response = client.get("/advisor/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "greedy: gpu_memory_utilization 0.97 is outside 0.85-0.92" in body
    assert "Evidence" in body and "Fix" in body and "/serving/profiles/" in body
    client.force_login(team_setup["bob"])  # another team sees none of it
    assert "greedy" not in client.get("/advisor/").content.decode()
