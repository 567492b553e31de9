"""Benchmark runs against a fake cloud channel (fast, no engine): the statistics, errors, routes, the pages, bad
input, comparison; the ladder's and the sweep's plans and choices without starting an engine."""
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from panel.audit.models import AuditAction, AuditEvent
from panel.benchmarks import ladder as ladders
from panel.benchmarks import runner, workload
from panel.benchmarks.models import BenchmarkRun
from panel.benchmarks.services import benchmark_execute, benchmark_launch
from panel.channels.models import Channel, Route, RouteChannel
from panel.jobs.models import JobState
from tests.support.benchmarks import assert_sane, fake_channel, post_run, run_now, tiny_model  # noqa: F401 (fixture)
from tests.support.credential_env import bind_credential_env
from tests.support.fake_upstream import FakeUpstream


def test_it_measures_a_fake_channel_and_leaves_the_warm_up_out(team_setup):
    team = team_setup["team_a"]
    with FakeUpstream(chunks=12, chunk_delay=0.002) as fake:
        channel = fake_channel(team, fake)
        run = benchmark_launch(team=team, user=team_setup["alice"], target_kind="channel", target_id=channel.pk,
                               requests=20, warmup_requests=3, concurrency=4, output_tokens=10, enqueue=False)
        run = run_now(run)
        sent = fake.request_count
    assert run.state == JobState.SUCCEEDED, run.failure_reason
    assert sent == 23  # 3 warm-up + 20 measured
    result = run.result
    assert_sane(result, 20)
    assert result["total_output_tokens"] == 20 * 10  # max_tokens caps the fake's 12 words
    # 10 content chunks 2 ms apart: 9 gaps per request, each at least the fake's delay
    assert result["median_itl_ms"] >= 2 and result["median_tpot_ms"] >= 2
    assert result["request_goodput"] is None  # no SLO set
    assert result["targets"] == {"cloud": 20}
    assert run.progress == 100 and run.phase == "done"


def test_it_counts_failed_requests_as_errors(team_setup):
    team = team_setup["team_a"]
    with FakeUpstream() as fake:
        channel = fake_channel(team, fake)
        fake.behave("status_503", times=3)
        run = run_now(benchmark_launch(team=team, user=None, target_kind="channel", target_id=channel.pk,
                                       requests=10, warmup_requests=0, concurrency=1, enqueue=False))
        assert run.result["failed"] == 3 and run.result["completed"] == 7
        assert run.result["first_error"].startswith("HTTP 503")
        assert run.result["error_kinds"] == {"HTTP 503": 3}
        fake.behave("refuse")
        failed = run_now(benchmark_launch(team=team, user=None, target_kind="channel", target_id=channel.pk,
                                          requests=3, warmup_requests=0, enqueue=False))
    assert failed.state == JobState.FAILED and failed.failure_kind == "all_requests_failed"
    assert "all 3 requests failed" in failed.failure_reason
    assert failed.result["failed"] == 3 and failed.result["completed"] == 0  # the errors that explain it, with it


def test_it_spreads_a_route_over_its_channels_by_weight(team_setup):
    team = team_setup["team_a"]
    with FakeUpstream(models=("m-a",)) as first, FakeUpstream(models=("m-b",)) as second:
        route = Route.objects.create(team=team, model_name="mixed", strategy="weighted")
        RouteChannel.objects.create(route=route, channel=fake_channel(team, first, "a"), position=0, weight=1)
        RouteChannel.objects.create(route=route, channel=fake_channel(team, second, "b"), position=1, weight=1)
        run = run_now(benchmark_launch(team=team, user=None, target_kind="route", target_id=route.pk, requests=40,
                                       warmup_requests=0, concurrency=8, enqueue=False))
    assert run.state == JobState.SUCCEEDED
    assert set(run.result["targets"]) == {"a", "b"} and sum(run.result["targets"].values()) == 40


def test_it_fails_a_run_whose_channel_key_is_missing(team_setup, monkeypatch):
    team = team_setup["team_a"]
    monkeypatch.delenv("TOKENWISE_UPSTREAM_BENCH_TEST", raising=False)
    bind_credential_env(monkeypatch, "TOKENWISE_UPSTREAM_BENCH_TEST", "http://127.0.0.1:9")
    channel = Channel.objects.create(team=team, name="env", base_url="http://127.0.0.1:9/v1", model_id="x",
                                     credential_kind="env", credential_env="TOKENWISE_UPSTREAM_BENCH_TEST")
    run = run_now(benchmark_launch(team=team, user=None, target_kind="channel", target_id=channel.pk, requests=2,
                                   enqueue=False))
    assert run.state == JobState.FAILED and run.failure_kind == "target_unavailable"
    assert "TOKENWISE_UPSTREAM_BENCH_TEST is not set" in run.failure_reason


def test_it_builds_synthetic_prompts_with_and_without_a_shared_prefix():
    shared = workload.synthetic_prompts(count=3, input_tokens=40, shared_system_prompt=True)
    assert len({prompt[0]["content"] for prompt in shared}) == 1 and shared[0][0]["role"] == "system"
    assert len({prompt[1]["content"] for prompt in shared}) == 3
    alone = workload.synthetic_prompts(count=3, input_tokens=40, shared_system_prompt=False)
    assert all(len(prompt) == 1 for prompt in alone)
    assert len({prompt[0]["content"][:12] for prompt in alone}) == 3  # no shared prefix
    assert 30 <= len(alone[0][0]["content"].split()) <= 42


def test_it_reads_prompt_files_and_says_which_line_is_wrong():
    good = (b'{"prompt": "hello"}\n\n'
            b'{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}\n"plain"\n')
    prompts = workload.parse_prompt_file(good, name="p.jsonl", max_bytes=10_000)
    assert prompts == [[{"role": "user", "content": "hello"}],
                       [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                       [{"role": "user", "content": "plain"}]]
    assert workload.parse_prompt_file(b"one\n\ntwo\n", name="p.txt", max_bytes=100) == [
        [{"role": "user", "content": "one"}], [{"role": "user", "content": "two"}]]
    cases = {
        (b'{"prompt": "a"}\n{"prompt": ', "p.jsonl"): "line 2 is not valid JSON",
        (b'{"text": "a"}\n', "p.jsonl"): "line 1: needs a non-empty \"prompt\"",
        (b'{"messages": [{"role": "robot", "content": "x"}]}', "p.jsonl"): "unknown role(s) robot",
        (b"\n  \n", "p.txt"): "no prompts",
        (b"caf\xe9\n", "p.txt"): "not UTF-8",
        (b"a\x00b", "p.txt"): "NUL bytes",
        (b"x" * 101, "p.txt"): "the limit is 100 bytes",
    }
    for (data, name), expected in cases.items():
        with pytest.raises(Exception) as error:
            workload.parse_prompt_file(data, name=name, max_bytes=100)
        assert expected in " ".join(error.value.messages), (data, error.value.messages)


def test_it_computes_percentiles_that_never_cross():
    assert runner.percentile([], 50) is None
    assert runner.percentile([5.0], 99) == 5.0
    values = [0.1, 0.2, 0.3, 0.4, 10.0]
    assert runner.percentile(values, 50) == 0.3
    assert runner.percentile(values, 50) <= runner.percentile(values, 95) <= runner.percentile(values, 99) <= 10.0
    summary = runner.summarize([runner.Sample(ok=True, ttft=0.1, latency=0.5, itl=[0.1] * 4, output_tokens=5),
                                runner.Sample(ok=False, error="HTTP 429: slow down")], 2.0)
    assert summary["request_throughput"] == 0.5 and summary["output_throughput"] == 2.5
    assert summary["failed"] == 1 and summary["error_rate"] == 0.5 and summary["error_kinds"] == {"HTTP 429": 1}


def test_it_refuses_bad_input_with_a_clear_message_and_saves_nothing(client, team_setup, settings):
    settings.BENCHMARK_MAX_UPLOAD_BYTES = 2048
    team = team_setup["team_a"]
    channel = Channel.objects.create(team=team, name="c", base_url="http://127.0.0.1:9/v1", model_id="m")
    other = Channel.objects.create(team=team_setup["team_b"], name="theirs", base_url="http://127.0.0.1:9/v1",
                                   model_id="m")
    client.force_login(team_setup["alice"])
    cases = [
        ({"requests": 0}, "Ensure this value is greater than or equal to 1"),
        ({"concurrency": 5000}, "less than or equal to 256"),
        ({"request_rate": "-1"}, "greater than or equal to 0.001"),
        ({"workload": "file"}, "Upload a prompt file"),
        ({"workload": "file", "prompts_file": SimpleUploadedFile("p.jsonl", b'{"prompt": "a"}\n{oops}\n')},
         "line 2 is not valid JSON"),
        ({"workload": "file", "prompts_file": SimpleUploadedFile("big.txt", b"a line\n" * 400)},
         "the limit is 2,048 bytes"),
        ({"workload": "file", "prompts_file": SimpleUploadedFile("bin.txt", b"\xff\xfe\x00\x01")}, "NUL bytes"),
        ({"target": f"channel:{other.pk}"}, "Select a valid choice"),
        ({"target": "nonsense"}, "Select a valid choice"),
    ]
    for changes, message in cases:
        response = post_run(client, channel, **changes)
        assert response.status_code == 400, changes
        assert message in response.content.decode(), (changes, message)
    assert BenchmarkRun.objects.count() == 0
    assert not AuditEvent.objects.filter(action=AuditAction.BENCHMARK_LAUNCHED).exists()


def test_it_launches_from_the_page_audits_it_and_compares_runs(client, team_setup, django_capture_on_commit_callbacks):
    team = team_setup["team_a"]
    client.force_login(team_setup["alice"])
    with FakeUpstream(chunks=6) as fake:
        channel = fake_channel(team, fake)
        prompts = SimpleUploadedFile("p.jsonl", b'{"prompt": "first"}\n{"prompt": "second"}\n')
        with django_capture_on_commit_callbacks(execute=False) as queued:
            response = post_run(client, channel, workload="file", prompts_file=prompts, name="file run")
        assert response.status_code == 302 and len(queued) == 1  # one task, sent on commit
        first = BenchmarkRun.objects.get(name="file run")
        assert response["Location"] == reverse("benchmark_run", args=[first.pk])
        assert first.prompts == [[{"role": "user", "content": "first"}], [{"role": "user", "content": "second"}]]
        assert first.queue == "long"
        event = AuditEvent.objects.get(action=AuditAction.BENCHMARK_LAUNCHED)
        assert event.actor == team_setup["alice"] and event.team == team and f"#{first.pk}" in event.target
        run_now(first)
        with django_capture_on_commit_callbacks(execute=False):
            post_run(client, channel, workload="synthetic", input_tokens=64, shared_system_prompt="on",
                     name="synthetic run")
        second = run_now(BenchmarkRun.objects.get(name="synthetic run"))
    assert first.state == second.state == JobState.SUCCEEDED
    assert second.result["mean_input_tokens"] > first.result["mean_input_tokens"]

    page = client.get(reverse("benchmark_run", args=[first.pk])).content.decode()
    assert "Output token throughput" in page and "TPOT" in page and "data-live-done" in page
    compare = client.get(reverse("benchmark_compare") + f"?run={first.pk}&run={second.pk}")
    assert compare.status_code == 200
    html = compare.content.decode()
    assert "file run" in html and "synthetic run" in html and "P99 E2EL" in html
    assert html.count("data-plotly") == 2 and "plotly/plotly.min.js" in html

    for query, message in [("?run=abc", "run must be a run number"), (f"?run={first.pk}", "Pick 2 to 6"),
                           (f"?run={first.pk}&run=999999", "No run 999999")]:
        bad = client.get(reverse("benchmark_compare") + query)
        assert bad.status_code == 400 and message in bad.content.decode()
    client.force_login(team_setup["bob"])  # another team: its runs are not there
    assert client.get(reverse("benchmark_run", args=[first.pk])).status_code == 404
    assert client.get(reverse("benchmark_compare") + f"?run={first.pk}&run={second.pk}").status_code == 400


def test_it_lets_a_viewer_read_but_not_launch(client, team_setup):
    client.force_login(team_setup["vera"])
    page = client.get(reverse("benchmarks"))
    assert page.status_code == 200 and "New run" not in page.content.decode()
    assert client.post(reverse("benchmark_create"), {}).status_code == 403


def cpu_host():
    from django.utils import timezone

    from panel.hosts.models import WorkerHost

    host = WorkerHost.objects.create(name="gpu@cpu-box", host="cpu-box", kind="gpu", cpu_count=2,
                                     memory_bytes=16 << 30, memory_available_bytes=12 << 30, last_seen=timezone.now())
    return host


def test_it_plans_the_ladder_and_skips_awq_with_the_reason(team_setup, tiny_model):
    from panel.hosts.models import EngineCheck
    from panel.registry.models import RegisteredModel

    def engine_check(serves_awq):
        from django.utils import timezone

        EngineCheck.objects.create(team=team_setup["team_a"], host=host, state="succeeded", finished_at=timezone.now(),
                                   result={"serves_awq": serves_awq})

    host = cpu_host()
    ladder = ladders.Ladder(team=team_setup["team_a"], model=tiny_model, small_max_num_seqs=2, large_max_num_seqs=16,
                            max_model_len=1024, extra_args="--enforce-eager")
    # A CPU host whose engine was never checked: whether it has the AWQ kernel is unknown, and unknown is not yes.
    plan = ladders.ladder_profiles(ladder, host)
    assert [step[0] for step in plan] == ["baseline", "awq", "prefix", "batching", "fp8", "ngram"]
    baseline, awq, prefix, batching = (step[4] for step in plan[:4])
    assert awq is None
    assert "can serve quantized weights (AWQ, W8A8) is not known yet: run its engine check" in plan[1][5]
    assert plan[4][4] is None and "FP8 is not served on cpu-box: not known yet" in plan[4][5]
    assert plan[5][4] is None and "supports speculative decoding is not known yet" in plan[5][5]
    assert (baseline["enable_prefix_caching"], baseline["max_num_seqs"], baseline["block_size"]) == (False, 2, 32)
    assert prefix["enable_prefix_caching"] and prefix["model"] == tiny_model and prefix["max_num_seqs"] == 2
    assert batching["max_num_seqs"] == 16 and batching["enable_chunked_prefill"] and batching["enable_prefix_caching"]

    # A host that serves AWQ, and a model with no AWQ child yet: quantize it first.
    engine_check(True)
    plan = ladders.ladder_profiles(ladder, host)
    assert plan[1][4] is None and "tiny is not quantized" in plan[1][5] and "Quantize it first" in plan[1][5]

    child = RegisteredModel.objects.create(team=team_setup["team_a"], name="tiny-awq", path="/x", parent=tiny_model,
                                           quantization={"method": "awq", "bits": 4, "group_size": 128},
                                           **{f: getattr(tiny_model, f) for f in (
                                               "architecture", "model_type", "parameter_count", "num_layers",
                                               "linear_parameter_count", "num_attention_heads", "num_kv_heads",
                                               "hidden_size", "head_dim", "max_position_embeddings", "dtype",
                                               "size_bytes")})
    plan = ladders.ladder_profiles(ladder, host)
    assert plan[1][4]["model"] == child and plan[1][4]["quantization"] == "awq" and plan[1][5] == ""
    assert plan[2][4]["model"] == child  # prefix caching builds on the AWQ step
    # The host's latest engine check says it cannot serve AWQ (no AVX-512 build): the rule's reason, in words.
    engine_check(False)
    plan = ladders.ladder_profiles(ladder, host)
    assert plan[1][4] is None and "cannot serve AWQ" in plan[1][5] and "AVX-512" in plan[1][5]
    assert plan[2][4]["model"] == tiny_model


def test_the_ladder_serves_the_best_quantized_child_the_host_serves(team_setup, tiny_model):
    """A CPU host with the int8 kernel: the quantized step serves the W8A8 child, FP8 says why not, and the n-gram
    step adds the speculative config to the batching step."""
    from django.utils import timezone

    from panel.hosts.models import EngineCheck
    from panel.registry.models import ModelEvaluation, RegisteredModel

    host = cpu_host()
    EngineCheck.objects.create(team=team_setup["team_a"], host=host, state="succeeded", finished_at=timezone.now(),
                               result={"serves_awq": False, "speculative_ngram": True,
                                       "fp8_checked_by": "multiplication",
                                       "kernels": {"int8_scaled_mm": True, "w4a16": False, "fp8": False}})
    shape = {f: getattr(tiny_model, f) for f in ("architecture", "model_type", "parameter_count", "num_layers",
                                                  "linear_parameter_count", "num_attention_heads", "num_kv_heads",
                                                  "hidden_size", "head_dim", "max_position_embeddings", "dtype",
                                                  "size_bytes")}
    awq = RegisteredModel.objects.create(team=team_setup["team_a"], name="tiny-awq", path="/a", parent=tiny_model,
                                         quantization={"method": "awq", "bits": 4, "group_size": 128}, **shape)
    w8a8 = RegisteredModel.objects.create(team=team_setup["team_a"], name="tiny-w8a8", path="/b", parent=tiny_model,
                                          quantization={"method": "compressed-tensors", "bits": 8,
                                                        "scheme": "w8a8-int8"}, **shape)
    ladder = ladders.Ladder(team=team_setup["team_a"], model=tiny_model, small_max_num_seqs=2, large_max_num_seqs=16,
                            max_model_len=1024, extra_args="--enforce-eager")
    plan = {step[0]: step for step in ladders.ladder_profiles(ladder, host)}
    assert plan["awq"][4]["model"] == w8a8 and plan["awq"][4]["quantization"] == "compressed-tensors"
    assert awq != plan["awq"][4]["model"]  # AWQ would die at its first request on this processor
    assert plan["fp8"][4] is None and "this CPU cannot multiply FP8 weights" in plan["fp8"][5]
    ngram = plan["ngram"][4]
    assert ngram["model"] == w8a8 and ngram["max_num_seqs"] == 16
    assert ngram["extra_args"] == ("--enforce-eager --speculative-config '{\"method\": \"ngram\", "
                                   "\"num_speculative_tokens\": 3, \"prompt_lookup_max\": 3}'")
    from panel.serving.configfile import validate_extra_args

    assert validate_extra_args(ngram["extra_args"])[-1].startswith('--speculative-config={"method": "ngram"')
    # The quality column: the quantized child's report against the ladder's model.
    for model, perplexity in ((tiny_model, 20.0), (w8a8, 20.3)):
        ModelEvaluation.objects.create(model=model, perplexity=perplexity, tokens_scored=3, json_valid=24,
                                       json_total=24, size_bytes=1, details={"argmax": [1, 2, 3]})
    quality = ladders.step_quality(tiny_model, w8a8)
    assert round(quality.perplexity_change, 1) == 1.5 and quality.token_agreement == 100.0 and not quality.flags
    assert ladders.step_quality(tiny_model, tiny_model).perplexity_change is None


def test_it_refuses_a_ladder_for_a_quantized_model_or_bad_sizes(team_setup, tiny_model):
    from django.core.exceptions import ValidationError

    tiny_model.quantization = {"method": "awq", "bits": 4}
    with pytest.raises(ValidationError) as error:
        ladders.ladder_launch(team=team_setup["team_a"], user=None, model=tiny_model, small_max_num_seqs=8,
                              large_max_num_seqs=4, max_model_len=99999, enqueue=False)
    problems = error.value.message_dict
    assert "already quantized" in problems["model"][0] and "must be above" in problems["large_max_num_seqs"][0]
    assert "4,096" in problems["max_model_len"][0]
    assert not ladders.Ladder.objects.exists()


def test_it_refuses_a_ladder_or_sweep_where_deployments_hold_every_slot_of_the_worker(team_setup, tiny_model):
    from django.core.exceptions import ValidationError
    from django.utils import timezone

    from panel.hosts.models import WorkerHost
    from panel.serving.models import Deployment, ServingProfile

    team = team_setup["team_a"]
    host = WorkerHost.objects.create(name="gpu@box", host="box", kind="gpu", gpus=[], slots=2,
                                     last_seen=timezone.now())
    profile = ServingProfile.objects.create(team=team, name="chat", model=tiny_model, block_size=32)
    held = [Deployment.objects.create(team=team, profile=profile, host=host, state=state)
            for state in ("ready", "starting")]
    with pytest.raises(ValidationError) as error:
        ladders.ladder_launch(team=team, user=None, model=tiny_model, host=host, enqueue=False)
    assert error.value.messages == [
        f"box's GPU worker runs 2 jobs at once and deployments #{held[0].pk}, #{held[1].pk} hold all of them: each "
        "step's engine would wait until one stops. Stop one of them, or start the GPU worker with more slots "
        "(TOKENWISE_GPU_CONCURRENCY), then start again."]
    with pytest.raises(ValidationError):
        ladders.sweep_launch(team=team, user=None, profile=profile, values=[1, 4], p99_target_ms=1000, host=host,
                             enqueue=False)
    assert not ladders.Ladder.objects.exists() and not ladders.Sweep.objects.exists()
    Deployment.objects.filter(pk=held[0].pk).update(state="stopped")  # a slot is free again
    assert ladders.ladder_launch(team=team, user=None, model=tiny_model, host=host, enqueue=False).host == host


def test_it_picks_the_best_sweep_value_within_the_latency_target():
    points = [(4, {"output_throughput": 100, "p99_e2el_ms": 800}),
              (16, {"output_throughput": 300, "p99_e2el_ms": 1900}),
              (64, {"output_throughput": 420, "p99_e2el_ms": 5200})]
    assert ladders.sweep_best(points, 2000)[0] == 16
    assert ladders.sweep_best(points, 6000)[0] == 64
    best, why = ladders.sweep_best(points, 500)
    assert best is None and "lowest P99 was 800 ms at max_num_seqs=4" in why
    assert ladders.sweep_values_parse("64, 4,16 4") == [4, 16, 64]
    for bad in ("4", "a, b", "0, 4", ",".join(str(v) for v in range(1, 11))):
        with pytest.raises(Exception):
            ladders.sweep_values_parse(bad)


def test_it_computes_the_cost_per_million_tokens():
    # 2 per GPU hour, 1 GPU, 100 tokens/s = 0.36 M tokens/hour -> 5.56 per million
    assert round(ladders.cost_per_million(2, 1, 100), 2) == 5.56
    assert ladders.cost_per_million(0, 1, 100) is None


def test_it_cancels_a_running_benchmark_within_a_heartbeat(transactional_db, client, team_setup):
    import threading

    from panel.jobs.services import job_events

    team = team_setup["team_a"]
    with FakeUpstream(chunks=20, chunk_delay=0.05) as fake:  # one request takes about a second
        channel = fake_channel(team, fake)
        run = benchmark_launch(team=team, user=None, target_kind="channel", target_id=channel.pk, requests=200,
                               warmup_requests=0, concurrency=2, enqueue=False)
        worker = threading.Thread(target=benchmark_execute, kwargs={"run_id": run.pk, "worker": "test"})
        worker.start()
        from tests.support.waiting import wait_until

        wait_until(lambda: BenchmarkRun.objects.get(pk=run.pk).state == JobState.RUNNING, message="running")
        client.force_login(team_setup["alice"])
        response = client.post(reverse("benchmark_cancel", args=["run", run.pk]))
        assert response.status_code == 302
        worker.join(timeout=20)
        assert not worker.is_alive()
        sent = fake.request_count
    run.refresh_from_db()
    assert run.state == JobState.CANCELLED and sent < 200
    assert [event.to_state for event in job_events(run)] == ["pending", "running", "cancelling", "cancelled"]
    assert AuditEvent.objects.filter(action=AuditAction.JOB_CANCELLED, target=f"run #{run.pk}").exists()
    assert client.post(reverse("benchmark_cancel", args=["nonsense", run.pk])).status_code == 400


def test_it_paces_requests_at_a_request_rate(team_setup):
    team = team_setup["team_a"]
    with FakeUpstream(chunks=4) as fake:
        channel = fake_channel(team, fake)
        paced = run_now(benchmark_launch(team=team, user=None, target_kind="channel", target_id=channel.pk,
                                         requests=20, warmup_requests=0, concurrency=20, request_rate=10,
                                         enqueue=False))
        closed = run_now(benchmark_launch(team=team, user=None, target_kind="channel", target_id=channel.pk,
                                          requests=20, warmup_requests=0, concurrency=20, enqueue=False))
    assert paced.result["completed"] == closed.result["completed"] == 20
    # 20 Poisson arrivals at 10/s take about 2 s; the closed loop sends all 20 at once.
    assert paced.result["duration"] > 0.8 > closed.result["duration"]
    assert "10 req/s" in paced.workload_summary


def test_it_refuses_bad_ladder_and_sweep_forms(client, team_setup, tiny_model):
    from panel.serving.models import ServingProfile

    client.force_login(team_setup["alice"])
    assert client.get(reverse("benchmark_ladder_create")).status_code == 200
    assert client.get(reverse("benchmark_sweep_create")).status_code == 200
    base = {"workload": "builtin", "input_tokens": 32, "output_tokens": 8, "requests": 5, "warmup_requests": 1,
            "concurrency": 2}
    response = client.post(reverse("benchmark_ladder_create"), dict(
        base, model=tiny_model.pk, small_max_num_seqs=8, large_max_num_seqs=4, max_model_len=512, concurrency=16,
        repeats=3))
    assert response.status_code == 400 and "must be above the small one" in response.content.decode()
    profile = ServingProfile.objects.create(team=team_setup["team_a"], name="p", model=tiny_model, block_size=32)
    for values, message in [("4", "Give 2 to 8"), ("a, b", "whole numbers")]:
        response = client.post(reverse("benchmark_sweep_create"), dict(base, profile=profile.pk, values=values,
                                                                       p99_target_ms=1000))
        assert response.status_code == 400 and message in response.content.decode()
    # No GPU worker online: said in words, nothing queued.
    response = client.post(reverse("benchmark_sweep_create"), dict(base, profile=profile.pk, values="2, 4",
                                                                   p99_target_ms=1000))
    assert response.status_code == 400 and "No GPU worker is online" in response.content.decode()
    assert not ladders.Ladder.objects.exists() and not ladders.Sweep.objects.exists()


def test_it_says_what_the_prompt_token_count_includes():
    """"Input tokens 128" produced 203 prompt tokens without a word on why."""
    from django.template.loader import render_to_string

    from panel.benchmarks.forms import BenchmarkForm

    help_text = str(BenchmarkForm.base_fields["input_tokens"].help_text)
    assert "chat template" in help_text and "engine reported" in help_text
    html = render_to_string("benchmarks/_metrics.html", {"run": {"result": {"mean_input_tokens": 203,
                                                                               "mean_output_tokens": 64}}})
    assert "mean 203 per request, as the engine counted them: the prompt text plus the chat template" in html
