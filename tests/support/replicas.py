"""Replica test data: GPU worker hosts with room, and a serving profile (fixture)."""
import pytest
from django.utils import timezone

from panel.hosts.models import WorkerHost
from tests.support.channels import make_deployment

GIB = 2**30


def host(name, *, memory_gib=8, gpus=0):
    return WorkerHost.objects.create(name=f"gpu@{name}", host=name, kind="gpu", queues=["gpu", f"gpu.{name}"],
                                     last_seen=timezone.now(), memory_available_bytes=memory_gib * GIB,
                                     gpus=[{"index": i, "name": "H200", "memory_bytes": 141 * GIB,
                                            "memory_free_bytes": 140 * GIB} for i in range(gpus)])


@pytest.fixture
def profile(team_setup):
    deployment = make_deployment(team_setup["team_a"], team_setup["alice"], "tiny-replicas")
    profile = deployment.profile
    deployment.delete()
    profile.served_model_name, profile.max_model_len, profile.block_size = "tiny-chat", 2048, 32
    profile.save()
    return profile
