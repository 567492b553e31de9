"""Benchmark test helpers: a channel on a fake provider, a run executed in this thread, the page's form, the sanity
checks of a run's figures, and a registered tiny model (fixture)."""
import pytest
from django.urls import reverse

from panel.benchmarks.services import benchmark_execute
from panel.channels.models import Channel


def fake_channel(team, fake, name="cloud", **fields):
    return Channel.objects.create(team=team, name=name, kind="remote", base_url=fake.base_url,
                                  model_id=fake.models[0], credential_kind="none", timeout_seconds=5, max_retries=0,
                                  **fields)


def run_now(run):
    """The task body, in this thread (what the default worker runs)."""
    benchmark_execute(run_id=run.pk, worker="test-worker")
    run.refresh_from_db()
    return run


def assert_sane(result, requests):
    assert result["requests"] == requests and result["failed"] == 0 and result["completed"] == requests
    assert result["request_throughput"] > 0 and result["output_throughput"] > 0
    for family in ("ttft", "tpot", "itl", "e2el"):
        median, p90, p99 = (result[f"{stat}_{family}_ms"] for stat in ("median", "p90", "p99"))
        assert 0 < median <= p90 <= p99, (family, median, p90, p99)
        assert result[f"mean_{family}_ms"] > 0 and result[f"std_{family}_ms"] >= 0
    assert result["median_ttft_ms"] <= result["median_e2el_ms"]


def post_run(client, channel, **changes):
    data = {"target": f"channel:{channel.pk}", "workload": "builtin", "input_tokens": 32, "output_tokens": 8,
            "requests": 5, "warmup_requests": 1, "concurrency": 2, "request_rate": "", "name": ""}
    data.update(changes)
    return client.post(reverse("benchmark_create"), data)


@pytest.fixture
def tiny_model(team_setup, tmp_path):
    from panel.registry.models import RegisteredModel

    facts = dict(architecture="Qwen2ForCausalLM", model_type="qwen2", parameter_count=5_000_000,
                 linear_parameter_count=4_000_000, num_layers=4, num_attention_heads=4, num_kv_heads=2,
                 hidden_size=256, head_dim=64, max_position_embeddings=4096, dtype="float16", size_bytes=10_000_000)
    return RegisteredModel.objects.create(team=team_setup["team_a"], name="tiny", path=str(tmp_path), **facts)
