"""`make run`'s launcher: clear messages when a port is taken, and a full start, sign-in and Ctrl-C stop."""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.support.environment import ROOT
from tests.support.launcher import free_port, launcher_env, run_launcher
from tests.support.waiting import wait_until


@pytest.fixture
def occupied_port():
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def test_it_says_clearly_that_the_web_port_is_taken(tmp_path, occupied_port):
    result = run_launcher(launcher_env(tmp_path, TOKENWISE_PORT=str(occupied_port)))
    assert result.returncode != 0
    assert f"tokenwise: port {occupied_port} on 127.0.0.1 is taken" in result.stderr
    assert "TOKENWISE_PORT" in result.stderr and "Traceback" not in result.stderr


def test_it_says_clearly_that_the_redis_port_is_taken(tmp_path, occupied_port):
    result = run_launcher(launcher_env(tmp_path, TOKENWISE_PORT=str(free_port()),
                                       TOKENWISE_REDIS_PORT=str(occupied_port)))
    assert result.returncode != 0
    assert f"port {occupied_port} on 127.0.0.1 is taken, so Tokenwise cannot start its own Redis" in result.stderr
    assert "Traceback" not in result.stderr


def test_it_says_clearly_that_redis_url_does_not_answer(tmp_path):
    result = run_launcher(launcher_env(tmp_path, TOKENWISE_PORT=str(free_port()),
                                       REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"))
    assert result.returncode != 0
    assert "REDIS_URL does not answer" in result.stderr and "Traceback" not in result.stderr


def start_launcher(env):
    process = subprocess.Popen([sys.executable, "-m", "panel.launcher"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output = []

    def banner_seen():
        line = process.stdout.readline()
        if line:
            output.append(line)
        if process.poll() is not None and not line:
            raise AssertionError("launcher exited:\n" + "".join(output))
        return "Press Ctrl-C to stop everything." in line

    wait_until(banner_seen, seconds=240, interval=0, message="the launcher's banner")
    return process, "".join(output)


def sign_in(base, password):
    client = httpx.Client(base_url=base, follow_redirects=False, timeout=10)
    page = client.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    response = client.post("/login/", data={"username": "admin", "password": password,
                                            "csrfmiddlewaretoken": token})
    assert response.status_code == 302, response.text[:500]
    return client


def stop_launcher(process):
    launcher = psutil.Process(process.pid)
    family = [launcher] + launcher.children(recursive=True)
    assert len(family) >= 7  # launcher, redis, web, worker, long worker, gpu worker, beat (and pool children)
    os.kill(process.pid, signal.SIGINT)
    process.wait(timeout=60)
    time.sleep(0.5)
    survivors = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert survivors == [], [p.cmdline() for p in survivors]
    return process.stdout.read()


@pytest.mark.engine  # `make run` builds the demo model in the engine venv
def test_it_starts_everything_signs_in_and_stops_on_ctrl_c(tmp_path, demo_model_cache):
    port = free_port()
    env = launcher_env(tmp_path, TOKENWISE_PORT=str(port), TOKENWISE_REDIS_PORT=str(free_port()),
                       TOKENWISE_ADMIN_PASSWORD=None)
    demo_model_cache(tmp_path / "data")  # the run's trained build: the first start copies it (test_demo_model trains)
    process, output = start_launcher(env)
    try:
        password = re.search(r"Password:\s+(\S+)\s+\(shown once", output).group(1)
        assert f"Tokenwise is running at http://127.0.0.1:{port}/" in output
        client = sign_in(f"http://127.0.0.1:{port}", password)
        home = client.get("/")
        assert home.status_code == 200 and "Demo team" in home.text and "Workers" in home.text
        assert client.get("/static/css/tokenwise.css").status_code == 200

        def workers_online():
            page = client.get("/workers/live/").text
            return (page.count('pill ok">online') == 3 and "gpu@launchhost" in page and "default@launchhost" in page
                    and "long@launchhost" in page)

        wait_until(workers_online, seconds=90, interval=1, message="the three workers online on the Workers page")
        assert (tmp_path / "data" / "models" / "tokenwise-tiny-qwen2" / "config.json").exists()
    finally:
        rest = stop_launcher(process)
    assert "tokenwise: stopped." in rest

    # A second start reuses everything: the password is not printed again and still works.
    process, output = start_launcher(env)
    try:
        assert "shown once" not in output and "printed at the first start" in output
        sign_in(f"http://127.0.0.1:{port}", password)
    finally:
        stop_launcher(process)


def test_manage_py_uses_make_runs_secrets_and_redis_as_it_is(tmp_path):
    """After `make run`, `manage.py` needs nothing typed in front: it reads data/secrets/ and talks to make run's
    Redis (or REDIS_URL), like the panel's processes."""
    from cryptography.fernet import Fernet

    secrets_dir = tmp_path / "data" / "secrets"
    secrets_dir.mkdir(parents=True)
    (secrets_dir / "secret_key").write_text("k" * 50)
    fernet = Fernet.generate_key().decode()
    (secrets_dir / "encryption_key").write_text(fernet)
    (secrets_dir / "redis_password").write_text("p" * 43)
    script = ("import django; from django.conf import settings; from panel.core.crypto import keyring; keyring(); "
              "print(settings.SECRET_KEY == 'k' * 50, settings.REDIS_URL, settings.DATABASES['default']['NAME'])")
    env = launcher_env(tmp_path, TOKENWISE_REDIS_PORT="6399")
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-3:] == ["True", f"redis://:{'p' * 43}@127.0.0.1:6399/0",
                                        str(tmp_path / "data" / "tokenwise.sqlite3")]
    env["REDIS_URL"] = "redis://127.0.0.1:1234/2"
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split()[-2] == "redis://127.0.0.1:1234/2"
