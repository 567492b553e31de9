"""Benchmark figures in `vllm bench serve`'s terms, its --save-result JSON both ways, the ladder's spread and noise
verdict, the steps' own channels and routes (hidden, removed with the job) and the time estimates."""
import json

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from panel.benchmarks import estimate, metrics, runner, vllm_json
from panel.benchmarks.ladder import ladder_table
from panel.benchmarks.ladder_table import noise_verdict, spread
from panel.benchmarks.models import BenchmarkRun, Ladder, StepProfile
from panel.channels.models import Channel, Route, RouteChannel, listed_channels, listed_routes
from panel.jobs.models import JobState
from panel.serving.models import Deployment, DeploymentState, ServingProfile
from tests.support.api_helpers import bearer, token_for
from tests.support.benchmarks import tiny_model  # noqa: F401  (fixture)
from tests.support.browser import screenshot, sign_in


def sse(*events):
    return b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events)


def content(text, completion_tokens=None):
    event = {"choices": [{"index": 0, "delta": {"content": text}}]}
    if completion_tokens is not None:
        event["usage"] = {"prompt_tokens": 10, "completion_tokens": completion_tokens}
    return event


def test_a_stream_with_multi_token_chunks_gives_vllms_figures():
    """Chunks that arrive together are one arrival of k tokens: k gaps of its interval / k, not k-1 zero gaps."""
    reader = runner.StreamReader()
    # t=0.100: the first token; t=0.150: 1 token; t=0.250: 4 tokens in one read (4 SSE events, no running usage);
    # t=0.300: 2 tokens in one event as the server's running count says; then the usage and [DONE].
    assert reader.feed(sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}), 0.05) == ""
    assert reader.feed(sse(content("a")), 0.100) == ""
    assert reader.feed(sse(content(" b")), 0.150) == ""
    assert reader.feed(sse(*(content(f" w{i}") for i in range(4))), 0.250) == ""
    assert reader.feed(sse(content(" x y", completion_tokens=8)), 0.300) == ""
    assert reader.feed(sse({"choices": [{"delta": {}, "finish_reason": "length"}]}), 0.310) == ""
    reader.feed(sse({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 8}}) + b"data: [DONE]\n\n",
                0.320)
    assert reader.done and reader.arrivals == [(0.100, 1), (0.150, 1), (0.250, 4), (0.300, 2)]
    gaps = metrics.chunk_itls(reader.arrivals)
    assert gaps == pytest.approx([0.05, 0.025, 0.025, 0.025, 0.025, 0.025, 0.025])
    sample = runner.Sample(ok=True, ttft=0.100, latency=0.310, itl=gaps, prompt_tokens=10, output_tokens=8)
    second = runner.Sample(ok=True, ttft=0.200, latency=0.900, itl=[0.1] * 7, prompt_tokens=10, output_tokens=8)
    failed = runner.Sample(ok=False, error="HTTP 503: busy")
    result = metrics.summarize([sample, second, failed], 2.0, slo={"ttft": 150, "tpot": None, "e2el": 1000})
    # TPOT = (E2EL - TTFT) / (output tokens - 1)
    assert result["mean_tpot_ms"] == pytest.approx(((0.21 / 7) + (0.7 / 7)) / 2 * 1000)
    assert result["median_ttft_ms"] == pytest.approx(150) and result["std_ttft_ms"] == pytest.approx(50)
    assert result["p99_ttft_ms"] == pytest.approx(199) and result["p90_ttft_ms"] == pytest.approx(190)
    assert result["mean_e2el_ms"] == pytest.approx(605)
    # 14 per-token gaps: 7 of the first request (0.05, 6 × 0.025), 7 of 0.1 s
    assert result["mean_itl_ms"] == pytest.approx((0.05 + 6 * 0.025 + 0.7) / 14 * 1000)
    assert result["median_itl_ms"] == pytest.approx((0.05 + 0.1) / 2 * 1000)
    assert result["completed"] == 2 and result["failed"] == 1 and result["total_output_tokens"] == 16
    assert result["request_throughput"] == 1.0 and result["output_throughput"] == 8.0
    assert result["total_token_throughput"] == 18.0
    # Goodput: only the first request is within TTFT 150 ms (the second took 200 ms).
    assert result["good_requests"] == 1 and result["request_goodput"] == 0.5
    assert result["goodput_slo"] == {"ttft": 150, "e2el": 1000}


def test_a_bad_stream_event_is_an_error():
    assert runner.StreamReader().feed(b"data: {oops}\n", 0.1) == "malformed stream event"
    assert runner.StreamReader().feed(sse({"error": {"message": "no"}}), 0.1).startswith("error event")


@pytest.fixture
def finished_run(team_setup):
    result = metrics.summarize([runner.Sample(ok=True, ttft=0.1, latency=0.5, itl=[0.05] * 8, prompt_tokens=20,
                                              output_tokens=9)] * 3, 1.5, slo={"ttft": 200})
    now = timezone.now()
    return BenchmarkRun.objects.create(team=team_setup["team_a"], name="mine", target_kind="channel",
                                       target_label="channel cloud", state=JobState.SUCCEEDED, result=result,
                                       requests=3, concurrency=2, started_at=now, finished_at=now,
                                       slo_ttft_ms=200)


def test_a_result_exports_as_vllm_json_and_imports_back(client, team_setup, finished_run):
    client.force_login(team_setup["alice"])
    response = client.get(reverse("benchmark_run_export", args=[finished_run.pk]))
    assert response.status_code == 200 and "attachment" in response["Content-Disposition"]
    exported = json.loads(response.content)
    for key in ("date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
                "duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "request_goodput", "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_tpot_ms",
                "std_itl_ms", "p99_itl_ms", "p90_e2el_ms"):
        assert key in exported, key
    assert exported["request_rate"] == "inf" and exported["max_concurrency"] == 2
    assert exported["completed"] == 3 and exported["mean_itl_ms"] == pytest.approx(50)
    upload = SimpleUploadedFile("vllm-result.json", response.content, content_type="application/json")
    imported = client.post(reverse("benchmark_import"), {"result_file": upload, "title": "round trip"})
    assert imported.status_code == 302
    run = BenchmarkRun.objects.get(name="round trip")
    assert run.target_kind == "imported" and run.state == JobState.SUCCEEDED
    for key, value in exported.items():
        if vllm_json.METRIC_KEY.match(key) or key in ("duration", "completed", "request_throughput",
                                                        "output_throughput", "request_goodput"):
            assert run.result[key] == value, key
    again = vllm_json.export(run)
    assert {k: again[k] for k in again if vllm_json.METRIC_KEY.match(k)} == \
        {k: exported[k] for k in exported if vllm_json.METRIC_KEY.match(k)}
    page = client.get(reverse("benchmark_run", args=[run.pk])).content.decode()
    assert "Imported from vllm-result.json" in page and "TPOT" in page
    compare = client.get(reverse("benchmark_compare") + f"?run={finished_run.pk}&run={run.pk}")
    assert compare.status_code == 200 and "Median TPOT" in compare.content.decode()


def test_an_upstream_vllm_result_without_e2el_imports(team_setup):
    upstream = {"date": "20261130-120000", "backend": "vllm", "model_id": "Qwen/Qwen2.5-0.5B", "num_prompts": 100,
                "request_rate": "inf", "burstiness": 1.0, "max_concurrency": None, "duration": 12.5,
                "completed": 100, "total_input_tokens": 102400, "total_output_tokens": 12800,
                "request_throughput": 8.0, "request_goodput": None, "output_throughput": 1024.0,
                "total_token_throughput": 9216.0}
    for family in ("ttft", "tpot", "itl"):
        upstream.update({f"mean_{family}_ms": 10.0, f"median_{family}_ms": 9.0, f"std_{family}_ms": 1.0,
                         f"p99_{family}_ms": 20.0})
    run = vllm_json.import_result(team=team_setup["team_a"], user=None, data=json.dumps(upstream).encode(),
                                  name="up.json")
    assert run.result["p99_tpot_ms"] == 20.0 and "mean_e2el_ms" not in run.result
    assert run.target_label == "imported: Qwen/Qwen2.5-0.5B" and run.requests == 100


BAD_IMPORTS = [
    (b"\xff\xfe", "not UTF-8"),
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "one JSON object"),
    (b"{}", "“duration” is missing"),
    (json.dumps({"duration": "12"}).encode(), "“duration” must be a number"),
    (json.dumps({"duration": -1}).encode(), "“duration” must be a finite number of at least 0"),
    (b'{"duration": NaN}', "“duration” must be a finite number"),
    (json.dumps({"completed": 2.5}).encode(), "“completed” must be a whole number"),
    (json.dumps({"mean_ttft_ms": True}).encode(), "“mean_ttft_ms” must be a number"),
    (json.dumps({"p99_e2el_ms": "x"}).encode(), "“p99_e2el_ms” must be a number"),
    (json.dumps({"model_id": 5}).encode(), "“model_id” must be text"),
]


def test_a_bad_result_file_is_refused_in_words_and_nothing_is_written(client, team_setup):
    client.force_login(team_setup["alice"])
    for data, message in BAD_IMPORTS:
        with pytest.raises(ValidationError) as error:
            vllm_json.parse(data)
        assert any(message in text for text in error.value.messages), (data, error.value.messages)
        response = client.post(reverse("benchmark_import"), {"result_file": SimpleUploadedFile("r.json", data)})
        assert response.status_code == 400 and message in response.content.decode(), data
    with pytest.raises(ValidationError) as error:
        vllm_json.parse(b"x" * (vllm_json.MAX_IMPORT_BYTES + 1))
    assert "at most" in error.value.messages[0]
    assert not BenchmarkRun.objects.exists()
    client.force_login(team_setup["vera"])  # a viewer may not import
    assert client.post(reverse("benchmark_import"), {}).status_code == 403


def test_the_noise_verdict_reads_the_spreads():
    assert spread([]) is None and spread([10, 14, 12]) == (12, 10, 14)
    assert noise_verdict(spread([10, 14, 12]), spread([13, 16, 15])) == "within noise"
    assert noise_verdict(spread([20, 22, 21]), spread([10, 12, 11])) == ""
    assert noise_verdict(spread([20]), spread([10, 12])) == "one measurement"


def make_run(ladder, step, throughput, **fields):
    result = {"output_throughput": throughput, "median_ttft_ms": 50.0, "p99_e2el_ms": 900.0}
    return BenchmarkRun.objects.create(team=ladder.team, target_kind="deployment", target_label="d", ladder=ladder,
                                       step=step, state=JobState.SUCCEEDED, result=result, **fields)


def step_profile(ladder, key):
    profile = ServingProfile.objects.create(team=ladder.team, name=f"ladder {ladder.pk} · {key}", model=ladder.model,
                                            served_model_name=f"ladder-{ladder.pk}-{key}", block_size=32)
    StepProfile.objects.create(profile=profile, ladder=ladder)
    return profile


def test_the_ladder_table_gives_each_step_a_spread_and_says_when_a_gain_is_noise(team_setup, tiny_model):  # noqa: F811
    ladder = Ladder.objects.create(team=team_setup["team_a"], model=tiny_model, state=JobState.SUCCEEDED, repeats=3)
    steps = []
    for key, values in (("baseline", (100, 110, 105)), ("prefix", (108, 120, 112)), ("batching", (200, 210, 205))):
        profile = step_profile(ladder, key)
        runs = [make_run(ladder, key, value) for value in values]
        steps.append({"step": key, "status": "measured", "reason": "", "profile_id": profile.pk,
                      "run_id": runs[0].pk, "run_ids": [run.pk for run in runs]})
    ladder.result = {"steps": steps, "planned": 3}
    ladder.save()
    rows = {row["key"]: row for row in ladder_table(ladder)}
    assert rows["baseline"]["throughput"] == pytest.approx(105) and rows["baseline"]["repeats"] == 3
    assert (rows["prefix"]["low"], rows["prefix"]["high"]) == (108, 120)
    assert rows["prefix"]["gain_vs_previous"] == "+8%" and rows["prefix"]["noise"] == "within noise"
    assert rows["batching"]["gain_vs_previous"] == "+81%" and rows["batching"]["noise"] == ""
    assert rows["batching"]["noise_vs_baseline"] == ""


def test_step_channels_and_routes_are_the_jobs_own(client, team_setup, tiny_model, live_server, page):  # noqa: F811
    team = team_setup["team_a"]
    ladder = Ladder.objects.create(team=team, model=tiny_model, state=JobState.SUCCEEDED)
    profile = step_profile(ladder, "baseline")
    deployment = Deployment.objects.create(team=team, profile=profile, state=DeploymentState.STOPPED,
                                           served_model_name=profile.served_model_name)
    step_channel = Channel.objects.create(team=team, name=f"local-{profile.name}", kind="local",
                                          deployment=deployment, base_url="http://127.0.0.1:9/v1",
                                          model_id=profile.served_model_name, enabled=False)
    step_route = Route.objects.create(team=team, model_name=profile.served_model_name)
    RouteChannel.objects.create(route=step_route, channel=step_channel, position=0)
    mine = Channel.objects.create(team=team, name="my-cloud", base_url="http://127.0.0.1:9/v1", model_id="m")
    my_route = Route.objects.create(team=team, model_name="chat")
    run = make_run(ladder, "baseline", 100.0)
    assert list(listed_channels(team)) == [mine]
    assert list(listed_routes(team)) == [my_route]

    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}{reverse('channels')}")
    listed = page.inner_text("main")
    assert "my-cloud" in listed and "chat" in listed
    assert "local-ladder" not in listed and profile.served_model_name not in listed
    page.goto(f"{live_server.url}{reverse('benchmarks')}")
    targets = page.inner_text("#id_target")
    assert "my-cloud" in targets and "local-ladder" not in targets and profile.served_model_name not in targets

    # Nor in the management API's lists, nor the dashboards' channel filter.
    raw = token_for(team_setup["alice"], team)
    api_channels = [item["name"] for item in client.get("/api/v1/channels", **bearer(raw)).json()]
    api_routes = [item["model_name"] for item in client.get("/api/v1/routes", **bearer(raw)).json()]
    assert api_channels == ["my-cloud"] and api_routes == ["chat"]
    client.force_login(team_setup["alice"])
    dashboards = client.get(reverse("dashboards")).content.decode()
    assert "my-cloud" in dashboards and "local-ladder" not in dashboards
    # Nor on Serving (the ladder's page shows its steps), nor in the gateway's /v1/models.
    serving = client.get(reverse("serving")).content.decode()
    assert profile.name not in serving and f"#{deployment.pk}<" not in serving
    from panel.channels.routing import _load_names  # what model_names caches (the browser holds this thread's loop)
    assert _load_names(team.pk) == ["chat"]

    response = client.post(reverse("benchmark_remove", args=["ladder", ladder.pk]))
    assert response.status_code == 302
    assert not Ladder.objects.filter(pk=ladder.pk).exists() and not BenchmarkRun.objects.filter(pk=run.pk).exists()
    assert not Channel.objects.filter(pk=step_channel.pk).exists()
    assert not Route.objects.filter(pk=step_route.pk).exists()
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert not ServingProfile.objects.filter(pk=profile.pk).exists()
    assert Channel.objects.filter(pk=mine.pk).exists() and Route.objects.filter(pk=my_route.pk).exists()


def test_the_quantized_step_is_named_after_the_scheme_it_ran(team_setup, tiny_model):  # noqa: F811
    from panel.benchmarks.ladder import step_profile_name
    from panel.registry.models import RegisteredModel

    ladder = Ladder.objects.create(team=team_setup["team_a"], model=tiny_model, state=JobState.SUCCEEDED)
    w8a8 = RegisteredModel.objects.create(
        team=ladder.team, name="tiny-w8a8", path=tiny_model.path + "-w8a8", parent=tiny_model, architecture="x",
        model_type="qwen2", parameter_count=1, linear_parameter_count=1, num_layers=1, num_attention_heads=4,
        num_kv_heads=2, hidden_size=256, head_dim=64, max_position_embeddings=4096, dtype="bfloat16", size_bytes=1,
        quantization={"method": "compressed-tensors", "bits": 8, "scheme": "w8a8-int8"})
    assert step_profile_name(ladder, "awq", {"model": w8a8}) == f"ladder {ladder.pk} · w8a8-int8"
    assert step_profile_name(ladder, "awq", None) == f"ladder {ladder.pk} · awq"  # skipped: no profile is made
    assert step_profile_name(ladder, "prefix", {"model": tiny_model}) == f"ladder {ladder.pk} · prefix"


def test_a_waiting_step_says_which_deployments_hold_the_workers_slots(team_setup, tiny_model):  # noqa: F811
    from panel.benchmarks.ladder import _waiting_for
    from panel.hosts.models import WorkerHost

    team = team_setup["team_a"]
    host = WorkerHost.objects.create(name="gpu@box", host="box", kind="gpu", gpus=[], last_seen=timezone.now())
    ladder = Ladder.objects.create(team=team, model=tiny_model, state=JobState.RUNNING, host=host)
    mine = ServingProfile.objects.create(team=team, name="chat", model=tiny_model, block_size=32)
    step = Deployment.objects.create(team=team, profile=step_profile(ladder, "baseline"), host=host,
                                     state=DeploymentState.PENDING)
    assert _waiting_for(step) == ""  # nothing else runs there
    held = [Deployment.objects.create(team=team, profile=mine, host=host, state=state)
            for state in (DeploymentState.READY, DeploymentState.STARTING)]
    Deployment.objects.create(team=team, profile=mine, host=host, state=DeploymentState.STOPPED)
    assert _waiting_for(step) == (f": waiting for a free slot on box's GPU worker, held by deployments #{held[0].pk}, "
                                  f"#{held[1].pk} (each running deployment holds one until it stops; stop one to go "
                                  "on)")
    step.state = DeploymentState.STARTING
    assert _waiting_for(step) == ""
    # The same host's other engines, said when the ladder starts (its own steps are not counted).
    from panel.benchmarks.ladder import shared_host_warning
    assert shared_host_warning(ladder).startswith(f"box also runs deployments #{held[0].pk}, #{held[1].pk}: each "
                                                  "holds one of its GPU worker's slots")
    Deployment.objects.filter(pk__in=[d.pk for d in held]).update(state=DeploymentState.STOPPED)
    assert shared_host_warning(ladder) == ""


def test_an_active_ladder_is_not_removed(client, team_setup, tiny_model):  # noqa: F811
    ladder = Ladder.objects.create(team=team_setup["team_a"], model=tiny_model, state=JobState.RUNNING)
    client.force_login(team_setup["alice"])
    response = client.post(reverse("benchmark_remove", args=["ladder", ladder.pk]), follow=True)
    assert "cancel it first" in response.content.decode() and Ladder.objects.filter(pk=ladder.pk).exists()


def test_the_estimate_uses_this_hosts_earlier_steps_or_says_it_is_a_default(team_setup, tiny_model):  # noqa: F811
    figures = estimate.host_figures(None)
    assert not figures["measured"] and figures["engine_start"] == estimate.DEFAULT_ENGINE_START_SECONDS
    ladder = Ladder.objects.create(team=team_setup["team_a"], model=tiny_model, state=JobState.SUCCEEDED)
    profile = step_profile(ladder, "baseline")
    now = timezone.now()
    deployment = Deployment.objects.create(team=ladder.team, profile=profile, state=DeploymentState.STOPPED,
                                           started_at=now - timezone.timedelta(seconds=40), ready_at=now)
    make_run(ladder, "baseline", 100.0, deployment=deployment, requests=18, warmup_requests=2,
             started_at=now, finished_at=now + timezone.timedelta(seconds=10))
    figures = estimate.host_figures(None)
    assert figures["measured"] and figures["engine_start"] == 40 and figures["per_request"] == 0.5
    seconds = estimate.job_estimate(figures, steps=4, requests=38, warmup=2, repeats=3)
    assert seconds == 4 * (40 + estimate.STOP_SECONDS + 3 * 40 * 0.5)
    assert estimate.duration_words(seconds) == "about 7 min"


def test_the_ladder_and_sweep_forms_show_the_estimate(team_setup, tiny_model, live_server, page):  # noqa: F811
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}{reverse('benchmark_ladder_create')}")
    box = page.locator("[data-estimate]")
    assert "Estimated time: about" in box.inner_text() and "no ladder or sweep step has run" in box.inner_text()
    assert page.input_value("#id_workload") == "synthetic" and page.is_checked("#id_shared_system_prompt")
    assert int(page.input_value("#id_concurrency")) > int(page.input_value("#id_small_max_num_seqs"))
    before = box.locator("[data-estimate-total]").inner_text()
    page.fill("#id_repeats", "10")
    page.fill("#id_requests", "500")
    after = box.locator("[data-estimate-total]").inner_text()
    assert after != before and " h " in after
    page.fill("#id_repeats", "3")
    page.fill("#id_requests", "48")
    screenshot(page, "benchmarks-ladder-form")
    page.goto(f"{live_server.url}{reverse('benchmark_sweep_create')}")
    assert page.locator("[data-estimate-steps]").inner_text() == "3"  # 4, 16, 64
    page.fill("#id_values", "4, 8, 16, 32, 64")
    assert page.locator("[data-estimate-steps]").inner_text() == "5"
    screenshot(page, "benchmarks-sweep-form")


def test_a_running_ladder_shows_the_time_left(client, team_setup, tiny_model):  # noqa: F811
    started = timezone.now() - timezone.timedelta(seconds=600)
    ladder = Ladder.objects.create(team=team_setup["team_a"], model=tiny_model, state=JobState.RUNNING,
                                   started_at=started, heartbeat_at=timezone.now(),
                                   result={"planned": 4, "steps": [{"step": "baseline", "status": "measured"},
                                                                   {"step": "awq", "status": "skipped"},
                                                                   {"step": "prefix", "status": "measured"}]})
    # Two steps done in 10 minutes: two more to go at that pace.
    assert estimate.time_left(ladder, steps_total=4, steps_done=2) == pytest.approx(600, abs=5)
    client.force_login(team_setup["alice"])
    html = client.get(reverse("benchmark_ladder", args=[ladder.pk])).content.decode()
    assert "Time left: about 1" in html and "Remove ladder" not in html  # about 10 min; not while it runs
    ladder.state = JobState.SUCCEEDED
    ladder.save()
    html = client.get(reverse("benchmark_ladder", args=[ladder.pk])).content.decode()
    assert "Time left" not in html and "Remove ladder" in html
