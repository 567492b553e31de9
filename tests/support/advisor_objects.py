"""Advisor test data: registered models, serving profiles, GPU hosts, deployments and request logs made to trigger (or
not) the advisor's rules."""
from datetime import timedelta

from django.utils import timezone

from panel.channels.models import Channel
from panel.hosts.models import WorkerHost
from panel.registry.models import RegisteredModel
from panel.serving.models import Deployment, ServingProfile
from panel.usage.models import RequestLog

GIB = 1024 ** 3


def make_model(team, name="qwen-7b", *, heads=28, kv_heads=4, params=7_600_000_000, quantization=None, parent=None):
    return RegisteredModel.objects.create(
        team=team, name=name, path=f"/models/{name}", architecture="Qwen2ForCausalLM", model_type="qwen2",
        parameter_count=params, linear_parameter_count=int(params * 0.9), num_layers=28, num_attention_heads=heads,
        num_kv_heads=kv_heads, hidden_size=3584, head_dim=128, max_position_embeddings=32768, dtype="bfloat16",
        size_bytes=params * 2, quantization=quantization or {}, parent=parent)


def make_profile(team, model, name="chat", **fields):
    fields.setdefault("block_size", 16)
    return ServingProfile.objects.create(team=team, model=model, name=name, **fields)


def make_host(name, *, kind="gpu", gpu_gib=141):
    gpus = [{"index": 0, "name": "NVIDIA H200", "memory_bytes": gpu_gib * GIB, "memory_free_bytes": 2 * GIB}]
    return WorkerHost.objects.create(name=f"{kind}@{name}", host=name, kind=kind, gpus=gpus if kind == "gpu" else [],
                                     last_seen=timezone.now())


def serve(team, profile, *, host=None, state="ready"):
    deployment = Deployment.objects.create(team=team, profile=profile, host=host, state=state, gpu_indices=[0])
    channel = Channel.objects.create(team=team, name=f"local-{profile.name}-{deployment.pk}", kind="local",
                                     deployment=deployment, base_url="http://127.0.0.1:9/v1", model_id=profile.name)
    return deployment, channel


def log(team, count, **fields):
    now = timezone.now()
    defaults = {"endpoint": "chat", "model": "chat", "status_code": 200, "outcome": "ok", "latency_ms": 100.0,
                "prompt_tokens": 100}
    RequestLog.objects.bulk_create([RequestLog(team=team, **{**defaults, "created_at": now - timedelta(
        seconds=count - index), **{name: value(index) if callable(value) else value for name, value in fields.items()}})
        for index in range(count)])
