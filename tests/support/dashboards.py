"""Dashboard test data and probes: a priced deployment (ready since a time before NOW), engine samples for a
deployment, the points a page's figure draws."""
from datetime import timedelta

from django.utils import timezone

from panel.dashboards.models import EngineSample
from panel.hosts.models import WorkerHost
from panel.registry.models import RegisteredModel
from panel.serving.models import Deployment, ServingProfile


def seed_engine(deployment, minutes=50):
    now = timezone.now()
    EngineSample.objects.bulk_create([EngineSample(
        deployment=deployment, team_id=deployment.team_id, at=now - timedelta(seconds=10 * i), seconds=10,
        prefix_queries=4000, prefix_hits=1000 + 40 * (i % 50), prompt_tokens=4000, generation_tokens=900,
        kv_cache_usage=0.2 + 0.004 * (i % 60), running=3, waiting=0,
        ttft={"le": {"0.05": 2, "0.1": 6, "0.25": 9, "+Inf": 10}, "count": 10, "sum": 0.9},
        itl={"le": {"0.01": 50, "0.025": 95, "+Inf": 100}, "count": 100, "sum": 1.4}) for i in range(minutes * 6)])


def figure_points(page, name):
    return page.evaluate("""(name) => {
        const node = document.getElementById('figure-' + name);
        if (!node || !node.data) return -1;
        return node.data.reduce((n, trace) => n + (trace.y || []).filter((y) => y !== null).length, 0);
    }""", name)


NOW = timezone.now()  # the deployments' ready time and the dashboards tests' clock


def make_deployment(team, *, price=None, gpu_count=None, ready_hours=10, gpu_indices=()):
    host = WorkerHost.objects.create(name=f"gpu@h{team.pk}", host=f"h{team.pk}", kind="gpu",
                                     gpu_price_per_hour=price, gpu_count=gpu_count)
    model = RegisteredModel.objects.create(team=team, name="m", path="/m", architecture="Qwen2ForCausalLM",
                                           model_type="qwen2", parameter_count=1, linear_parameter_count=1,
                                           num_layers=1, num_attention_heads=1, num_kv_heads=1, hidden_size=1,
                                           head_dim=1, max_position_embeddings=1, dtype="bf16", size_bytes=1)
    profile = ServingProfile.objects.create(team=team, name="p", model=model, served_model_name="tiny-chat")
    return Deployment.objects.create(team=team, profile=profile, host=host, state="ready",
                                     served_model_name="tiny-chat", base_url="http://127.0.0.1:9/v1",
                                     gpu_indices=list(gpu_indices),
                                     ready_at=NOW - timedelta(hours=ready_hours))
