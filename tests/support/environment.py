"""Where the test run keeps its files and its Redis, and the environment of a subprocess of the panel."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "support" / "fixtures"  # data files the tests read
DATA_DIR = Path(os.environ["TOKENWISE_DATA_DIR"])
REDIS_URL = os.environ["REDIS_URL"]
REDIS_PORT = int(REDIS_URL.rsplit(":", 1)[1].split("/")[0])


def panel_env(**changes):
    """The environment for a subprocess of the panel (manage.py, a worker): the real settings module."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="panel.settings", PYTHONUNBUFFERED="1")
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env
