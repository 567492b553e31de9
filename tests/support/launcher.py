"""Running `make run`'s launcher (`python -m panel.launcher`) as a fresh install would."""
import socket
import subprocess
import sys

from tests.support.environment import ROOT, panel_env


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launcher_env(tmp_path, **changes):
    """A fresh install's environment: nothing set but the data dir and what the test changes."""
    values = {"TOKENWISE_DATA_DIR": str(tmp_path / "data"), "SECRET_KEY": None, "REDIS_URL": None,
              "DATABASE_URL": None, "TOKENWISE_ENCRYPTION_KEYS": None, "TOKENWISE_HOST_NAME": "launchhost"}
    values.update(changes)
    return panel_env(**values)


def run_launcher(env, timeout=120):
    return subprocess.run([sys.executable, "-m", "panel.launcher"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
