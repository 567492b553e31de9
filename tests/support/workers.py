"""A real Celery worker process for a test (the conftest's start_worker fixture starts them)."""
import os
import signal
import subprocess
import sys
import time

from tests.support.environment import DATA_DIR, ROOT, panel_env


class WorkerProcess:
    """A real Celery worker (`python -m workers.start KIND`) against the test database and Redis."""

    def __init__(self, kind, database_path, extra_env=None, argv_prefix=()):
        """`argv_prefix`: what runs it elsewhere, e.g. inside a simulated host (tests/support/hosts.py)."""
        self.kind = kind
        self.log_path = DATA_DIR / f"worker-{kind}-{time.monotonic_ns()}.log"
        env = panel_env(DATABASE_URL=f"sqlite:///{database_path}", **(extra_env or {}))
        self.log_file = open(self.log_path, "wb")
        self.process = subprocess.Popen([*argv_prefix, sys.executable, "-m", "workers.start", kind], cwd=ROOT, env=env,
                                        stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"worker exited early:\n{self.log()}")
            if (b"beat: Starting" if self.kind == "beat" else b"ready.") in self.log_path.read_bytes():
                return self
            time.sleep(0.2)
        raise AssertionError(f"worker not ready after {seconds} s:\n{self.log()}")

    def log(self):
        return self.log_path.read_text(errors="replace")[-4000:]

    def child_pids(self):
        import psutil

        try:
            return [child.pid for child in psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self):
        """SIGKILL the whole worker (main process and pool children), as a lost host would."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log_file.close()
