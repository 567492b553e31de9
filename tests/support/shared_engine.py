"""One running tiny engine for the tests that need an engine to answer but not to start one: the product's own
supervisor runs it (serving/supervisor.py, the argv and key a deployment gets), started once per pytest worker, and
each test gets its own deployment row pointing at it, written by the same moves a gpu worker makes (claimed, then
ready: the local channel and its route follow). Starting and stopping an engine costs 40-70 s on these machines;
the tests that launch their own (tests that start, stop, crash, sleep or place engines) keep `launch_tiny`.

Tests that use it sit in SHARED_ENGINE_FILES: under `make test` xdist hands those files to one worker together
(tests/conftest.py's scheduler), so the run starts one shared engine, not one per worker that meets such a file.
A test must not change the engine itself (stop, restart, flood it); the engine's counters are cumulative across the
tests, so a test reads deltas (the dashboards' scraper does: its first sample is a baseline)."""
import secrets
import threading

from tests.support.waiting import wait_until

SHARED_ENGINE_FILES = (
    "tests/compare/test_vllm.py",
    "tests/dashboards/test_agents_vllm.py",
    "tests/dashboards/test_engine.py",
    "tests/dashboards/test_pools_engine.py",
    "tests/gateway/test_messages_vllm.py",
    "tests/system/test_codex_vllm.py",
)

# The union of what those tests asked of their own engines: Compare's long prefix-cache prompt (4,096 tokens), the
# agents replay's prefix caching; no tool calling (the Messages test relies on the gateway refusing tools for it).
PROFILE = dict(name="tiny-cpu", served_model_name="tiny-chat", max_model_len=4096, block_size=32, max_num_seqs=8,
               max_num_batched_tokens=4096, enable_prefix_caching=True, extra_args="--enforce-eager")


class _Hooks:
    """The supervisor's hooks for an engine no deployment row owns: remember the start, stop on request."""

    def __init__(self):
        self.pid = None
        self.verification = None
        self.stop = threading.Event()

    def started(self, pid):
        self.pid = pid

    def ready(self, verification):
        self.verification = verification

    def beat(self, log_lines):
        return self.stop.is_set()

    def stop_requested(self):
        return self.stop.is_set()


class SharedEngine:
    """The tiny demo model served by vLLM under the product's supervisor, in a thread of this pytest worker."""

    def __init__(self, folder):
        from django.conf import settings

        from panel.registry.demo_model import build_demo_model
        from panel.registry.models import RegisteredModel
        from panel.serving import supervisor
        from panel.serving.models import ServingProfile
        from panel.serving.services import CPU_ENGINE_ENV, launch_argv

        self.model_path = folder / "tiny"
        build_demo_model(self.model_path)
        profile = ServingProfile(model=RegisteredModel(name="tiny", path=str(self.model_path)), **PROFILE)
        self.port = supervisor.free_port()
        self.argv = launch_argv(profile, port=self.port, cpu_host=True)
        self.key = secrets.token_urlsafe(32)
        self.base_url = f"http://{settings.ENGINE_ADVERTISE_HOST}:{self.port}/v1"
        self.log_path = folder / "engine.log"
        self.hooks = _Hooks()
        self.outcome = None
        env = {"VLLM_CPU_KVCACHE_SPACE": str(settings.CPU_KVCACHE_GIB), "VLLM_API_KEY": self.key, **CPU_ENGINE_ENV}

        def run():
            self.outcome = supervisor.run_server(
                self.argv, env=env, port=self.port, served_model_name=PROFILE["served_model_name"],
                hooks=self.hooks, log_path=self.log_path, wanted_quantization="",
                wanted_prefix_caching=True, grace_seconds=5)

        # The engine dies with the thread that started it (processes.py's parent-death signal): this one lives
        # until stop().
        self.thread = threading.Thread(target=run, name="shared-engine", daemon=True)
        self.thread.start()

    def wait_ready(self, seconds=240):
        wait_until(lambda: self.hooks.verification is not None or not self.thread.is_alive(), seconds=seconds,
                   interval=0.5, message="the shared engine")
        assert self.hooks.verification is not None, f"the shared engine exited:\n{self.log_tail()}"
        assert not self.hooks.verification["problems"], self.hooks.verification
        return self

    def log_tail(self):
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def stop(self):
        self.hooks.stop.set()
        self.thread.join(timeout=30)

    def deployment(self, team):
        """A ready deployment of `team` on this engine, written as a gpu worker writes one (created, claimed with
        the port, command and encrypted key, started, ready): its local channel and route follow as in the
        product. Its rows go with the test's database; the engine stays."""
        from django.utils import timezone

        from panel.core import crypto
        from panel.hosts.models import WorkerHost
        from panel.jobs.services import job_claim, job_created
        from panel.registry.services import model_register
        from panel.serving.models import Deployment, DeploymentState, ServingProfile
        from panel.serving.services import DeploymentHooks

        assert self.thread.is_alive(), f"the shared engine is gone:\n{self.log_tail()}"
        model = model_register(team=team, user=None, source=str(self.model_path), name="tiny")
        profile = ServingProfile.objects.create(team=team, model=model, **PROFILE)
        host, _ = WorkerHost.objects.get_or_create(
            name="gpu@shared-engine", defaults=dict(host="shared-engine", kind="gpu", queues=["gpu"],
                                                    last_seen=timezone.now()))
        deployment = Deployment.objects.create(team=team, profile=profile, host=host, queue="gpu",
                                               served_model_name=profile.served_name)
        job_created(deployment, reason="the tests' shared engine")
        assert job_claim(deployment, worker=host.name, port=self.port, base_url=self.base_url, command=self.argv,
                         verification={}, engine_key_ciphertext=crypto.encrypt(self.key))
        hooks = DeploymentHooks(deployment)
        hooks.started(self.hooks.pid)
        hooks.ready(self.hooks.verification)
        deployment.refresh_from_db()
        assert deployment.state == DeploymentState.READY
        return deployment
