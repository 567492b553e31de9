"""Synthetic usage for demos and the benchmark: `manage.py seed_usage N` writes N realistic usage records spread
over the last 30 days for one team, with a local deployment (on a host with a GPU price) and two cloud channels."""
import math
import random
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from django.db import transaction

DAYS = 30
BATCH = 5000
LOCAL_MODEL = "qwen2.5-14b-awq"
CLOUD = (("taotoken-qwen", "qwen2.5-14b-instruct", "0.8", "2.4", "0.2"),
         ("taotoken-deepseek", "deepseek-v3", "2.0", "8.0", "0.5"))


def usage_seed_fixtures(*, team):
    """The channels, keys and local deployment the records point at (created once, reused after)."""
    from panel.channels.models import Channel
    from panel.gateway.models import TeamKey
    from panel.hosts.models import WorkerHost
    from panel.registry.models import RegisteredModel
    from panel.serving.models import Deployment, DeploymentState, ServingProfile

    now = datetime.now(timezone.utc)
    host, _ = WorkerHost.objects.get_or_create(
        name="gpu@seed-demo-host", defaults={"host": "seed-demo-host", "kind": "gpu", "cpu_count": 32,
                                             "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3",
                                                       "memory_bytes": 85899345920}],
                                             "gpu_price_per_hour": Decimal("2.50"), "gpu_count": 1})
    model, _ = RegisteredModel.objects.get_or_create(
        team=team, name="seed-qwen2.5-14b-awq", defaults={
            "path": "/models/qwen2.5-14b-awq", "architecture": "Qwen2ForCausalLM", "model_type": "qwen2",
            "parameter_count": 14_770_000_000, "linear_parameter_count": 13_000_000_000, "num_layers": 48,
            "num_attention_heads": 40, "num_kv_heads": 8, "hidden_size": 5120, "head_dim": 128,
            "max_position_embeddings": 32768, "dtype": "float16", "size_bytes": 9_000_000_000})
    profile, _ = ServingProfile.objects.get_or_create(team=team, name="seed-14b-awq", defaults={
        "model": model, "served_model_name": LOCAL_MODEL})
    deployment = Deployment.objects.filter(team=team, profile=profile).first()
    if deployment is None:
        deployment = Deployment.objects.create(team=team, profile=profile, host=host, state=DeploymentState.STOPPED,
                                               served_model_name=LOCAL_MODEL, gpu_indices=[0],
                                               base_url="http://seed-demo-host:8000/v1",
                                               ready_at=now - timedelta(days=DAYS), finished_at=now)
    local, _ = Channel.objects.get_or_create(team=team, name="seed-local-14b", defaults={
        "kind": "local", "deployment": deployment, "base_url": deployment.base_url, "model_id": LOCAL_MODEL,
        "enabled": False})
    clouds = []
    for name, model_id, price_in, price_out, price_cached in CLOUD:
        channel, _ = Channel.objects.get_or_create(team=team, name=name, defaults={
            "kind": "remote", "base_url": "https://taotoken.net/api/v1", "model_id": model_id, "enabled": False,
            "price_input_per_million": Decimal(price_in), "price_output_per_million": Decimal(price_out),
            "price_cached_per_million": Decimal(price_cached)})
        clouds.append(channel)
    keys = []
    for name in ("web-app", "batch-jobs", "agent", "support-bot", "analytics"):
        key = TeamKey.objects.filter(team=team, name=f"seed-{name}").first()
        if key is None:
            # A hash no key has, and revoked: the seeded keys can never be used.
            key = TeamKey.objects.create(team=team, name=f"seed-{name}", last4="seed", revoked_at=now,
                                         key_hash=f"seed-{team.pk}-{name}".ljust(64, "0")[:64])
        keys.append(key)
    return local, clouds, keys


def usage_seed(*, team, count, seed=1, days=DAYS, on_progress=None):
    """Write `count` RequestLog rows over the last `days` days, in time order, in batches. Returns seconds taken."""
    from panel.gateway.models import RequestLog

    local, clouds, keys = usage_seed_fixtures(team=team)
    rng = random.Random(seed)
    end = time.time()
    span = days * 86400
    began = time.monotonic()
    key_weights = (40, 25, 20, 10, 5)
    for first in range(0, count, BATCH):
        rows = []
        for i in range(first, min(first + BATCH, count)):
            at = end - span + (i + rng.random()) * span / count
            hour = (at % 86400) / 3600
            busy = 0.5 + 0.5 * math.sin((hour - 8) / 24 * 2 * math.pi)  # a working day: busier in the afternoon
            channel = local if rng.random() < 0.6 + 0.2 * busy else clouds[rng.random() < 0.3]
            is_local = channel is local
            prompt = int(rng.lognormvariate(6.6, 0.6))
            completion = int(rng.lognormvariate(5.2, 0.7))
            cached = int(prompt * rng.uniform(0.4, 0.8)) if is_local else int(prompt * rng.uniform(0, 0.3))
            failed = rng.random() < 0.012
            ttft = rng.lognormvariate(math.log(140 if is_local else 550), 0.45) * (1 + busy * 0.5)
            latency = ttft + completion * (18 if is_local else 12) * rng.uniform(0.8, 1.3)
            fell_back = not is_local and rng.random() < 0.08
            rows.append(RequestLog(
                team=team, key=rng.choices(keys, key_weights)[0], channel=channel,
                created_at=datetime.fromtimestamp(at, tz=timezone.utc), endpoint="chat",
                model=LOCAL_MODEL if is_local else channel.model_id, stream=rng.random() < 0.7,
                status_code=502 if failed else 200, outcome="error" if failed else "ok",
                error_kind="upstream_5xx" if failed else "", attempts=2 if fell_back else 1, fell_back=fell_back,
                prompt_tokens=0 if failed else prompt, completion_tokens=0 if failed else completion,
                cached_tokens=0 if failed else cached, ttft_ms=None if failed else round(ttft, 1),
                latency_ms=round(latency, 1), cost=0 if failed else channel.cost(prompt, completion, cached)))
        with transaction.atomic():
            RequestLog.objects.bulk_create(rows)
        if on_progress:
            on_progress(min(first + BATCH, count))
    return time.monotonic() - began
