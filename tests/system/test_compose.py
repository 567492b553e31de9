"""compose.yaml for production: every service the README promises, with health checks and volumes.
(No Docker engine runs here, so the file is checked for its structure, not started.)"""
import yaml

from tests.support.environment import ROOT

COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_it_defines_every_production_service():
    assert set(COMPOSE["services"]) == {"postgres", "redis", "web", "worker", "long-worker", "beat", "gpu-worker"}


def test_it_health_checks_the_long_running_services():
    for name in ["postgres", "redis", "web", "worker", "long-worker", "gpu-worker"]:
        assert COMPOSE["services"][name]["healthcheck"]["test"], name


def test_it_points_every_panel_process_at_postgres_and_redis():
    for name in ["web", "worker", "long-worker", "beat", "gpu-worker"]:
        environment = COMPOSE["services"][name]["environment"]
        assert environment["DATABASE_URL"].startswith("postgres://"), name
        assert environment["REDIS_URL"] == "redis://redis:6379/0", name
        assert "SECRET_KEY" in environment and "TOKENWISE_ENCRYPTION_KEYS" in environment
        assert COMPOSE["services"][name]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_long_work_has_a_worker_of_its_own_beside_the_default_one():
    """Evaluation runs and benchmarks on the default worker would hold up budgets, canaries and webhooks."""
    assert COMPOSE["services"]["worker"]["command"] == ["python", "-m", "workers.start", "default"]
    assert COMPOSE["services"]["long-worker"]["command"] == ["python", "-m", "workers.start", "long"]
    assert "long@" in COMPOSE["services"]["long-worker"]["healthcheck"]["test"][1]


def test_it_gives_the_gpu_worker_the_nvidia_runtime_and_the_engine():
    gpu = COMPOSE["services"]["gpu-worker"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert gpu["build"]["target"] == "gpu-worker"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ENGINE_PYTHON=/opt/engine/bin/python" in dockerfile and "vllm==" in dockerfile
    assert "--no-deps autoawq==0.2.9" in dockerfile


def test_the_web_container_reaches_the_gpu_workers_engines():
    """The gateway runs in the web container: an engine on the GPU worker's loopback would be out of its reach."""
    environment = COMPOSE["services"]["gpu-worker"]["environment"]
    assert environment["TOKENWISE_ENGINE_BIND"] == "${TOKENWISE_ENGINE_BIND:-0.0.0.0}"
    assert environment["TOKENWISE_ENGINE_ADVERTISE_HOST"] == "${TOKENWISE_ENGINE_ADVERTISE_HOST:-gpu-worker}"


def test_it_keeps_data_in_volumes():
    assert {"pgdata", "redisdata", "data"} <= set(COMPOSE["volumes"])
    assert "pgdata:/var/lib/postgresql/data" in COMPOSE["services"]["postgres"]["volumes"]
