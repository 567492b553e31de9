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
    def __init__(self, database_path, **env_changes):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = DATA_DIR / f"gateway-{self.port}.log"
        env = panel_env(DATABASE_URL=f"sqlite:///{database_path}", TOKENWISE_KEY_CACHE_SECONDS="0",
                        TOKENWISE_ROUTE_CACHE_SECONDS="0", TOKENWISE_GATEWAY_BACKOFF_BASE_MS="10", **env_changes)
        self.log_file = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "panel.asgi:application", "--host", "127.0.0.1", "--port",
             str(self.port), "--loop", "uvloop", "--http", "httptools", "--no-access-log"],
            cwd=ROOT, env=env, stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError("gateway exited:\n" + self.log_path.read_text())
            try:
                httpx.get(f"{self.url}/login/", timeout=1)  # not /v1: that would write a usage record
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("gateway did not start:\n" + self.log_path.read_text())

    def stop(self):
        """SIGTERM, as a supervisor stops it: the process writes its queued usage records on the way out. A SIGKILL
        (after 30 s: a loaded machine can take a while) loses them, and the log says so."""
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.log_file.write(b"\n[test] the gateway did not stop within 30 s of SIGTERM: killed\n")
        self.log_file.close()

    def log(self):
        return self.log_path.read_text(errors="replace")
