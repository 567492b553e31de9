"""The gateway as it runs in production: uvicorn with panel.asgi in a subprocess, on the test database."""
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from tests.support.environment import DATA_DIR, ROOT, panel_env


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class GatewayServer:
    """`attempts`: a port found free can be taken before uvicorn binds it (a fake upstream of the same test, asking
    the system for any port, may get it): then uvicorn exits and the server starts again on another port. Ready
    means the panel's login page answered 200 from this process, not merely that something answered on the port
    (a fake upstream answers 401 to every path)."""

    def __init__(self, database_path, attempts=3, **env_changes):
        self.env = panel_env(DATABASE_URL=f"sqlite:///{database_path}", TOKENWISE_KEY_CACHE_SECONDS="0",
                             TOKENWISE_ROUTE_CACHE_SECONDS="0", TOKENWISE_GATEWAY_BACKOFF_BASE_MS="10", **env_changes)
        for attempt in range(attempts):
            if self._start():
                return
            self.log_file.close()
        raise AssertionError(f"gateway exited {attempts} times, the last:\n" + self.log_path.read_text())

    def _start(self):
        """True once ready; False when uvicorn exited (its port taken); AssertionError after 30 s."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = DATA_DIR / f"gateway-{self.port}.log"
        self.log_file = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "panel.asgi:application", "--host", "127.0.0.1", "--port",
             str(self.port), "--loop", "uvloop", "--http", "httptools", "--no-access-log"],
            cwd=ROOT, env=self.env, stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                # not /v1: that would write a usage record
                if httpx.get(f"{self.url}/login/", timeout=1).status_code == 200 and self.process.poll() is None:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("gateway did not start:\n" + self.log_path.read_text())

    def stop(self):
        """SIGTERM, as a supervisor stops it: the process writes its queued usage records on the way out. A SIGKILL
        (after 30 s: a loaded machine can take a while) loses them, and the log says so. Once only."""
        if self.log_file.closed:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.log_file.write(b"\n[test] the gateway did not stop within 30 s of SIGTERM: killed\n")
        self.log_file.close()

    def log(self):
        return self.log_path.read_text(errors="replace")


class ModuleGateways:
    """The gateway processes a test module shares (the `module_gateways` fixture, tests/conftest.py): one per
    environment, started at its first use and kept for the module's next tests, or started again when a test stopped
    it. A gateway process starts in about 3 s, most of a short gateway test; it holds nothing a test could leak into
    the next but the usage records it has not written yet (`usage_settled` waits for them) and the requests it still
    serves (modules whose tests leave some behind start one per test: GATEWAY_PER_TEST, tests/support/gateway.py)."""

    def __init__(self, database_path):
        self.database_path, self.servers = database_path, {}

    def get(self, **env_changes):
        key = tuple(sorted(env_changes.items()))
        server = self.servers.get(key)
        if server is None or server.process.poll() is not None:
            server = self.servers[key] = GatewayServer(self.database_path, **env_changes)
        return server

    def stop(self):
        for server in self.servers.values():
            server.stop()
