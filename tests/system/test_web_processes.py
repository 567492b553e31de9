"""The web server in several processes (panel/web.py): the process count, and /metrics adding up every process's
counters whichever process answers the scrape."""
import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from panel import web
from panel.env import EnvError
from tests.support.environment import DATA_DIR, ROOT, panel_env
from tests.support.gateway_server import free_port
from tests.support.waiting import run_coroutine


def test_the_process_count_defaults_to_the_cores_but_one_and_is_validated(monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "counter_1.db").write_bytes(b"old run")
    monkeypatch.delenv("TOKENWISE_WEB_PROCESSES", raising=False)
    argv, env = web.command(["--port", "9"])
    assert argv[argv.index("--workers") + 1] == str(max(1, len(os.sched_getaffinity(0)) - 1))
    assert argv[-2:] == ["--port", "9"] and env["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path / "metrics")
    assert list((tmp_path / "metrics").iterdir()) == []  # a previous run's counters are not this run's
    monkeypatch.setenv("TOKENWISE_WEB_PROCESSES", "3")
    argv, _ = web.command([])
    assert argv[argv.index("--workers") + 1] == "3"
    for bad in ("0", "many"):
        monkeypatch.setenv("TOKENWISE_WEB_PROCESSES", bad)
        with pytest.raises(EnvError, match="TOKENWISE_WEB_PROCESSES"):
            web.command([])


@pytest.fixture
def two_process_server(tmp_path):
    port = free_port()
    env = panel_env(TOKENWISE_WEB_PROCESSES="2", PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
                    DATABASE_URL=f"sqlite:///{tmp_path / 'unused.sqlite3'}")
    log = open(DATA_DIR / f"web-{port}.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "panel.web", "--host", "127.0.0.1", "--port", str(port)],
                               cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (DATA_DIR / f"web-{port}.log").read_text()
            assert time.monotonic() < deadline, "the web server did not answer within 60 s"
            try:
                httpx.get(f"http://127.0.0.1:{port}/login/", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield process, f"http://127.0.0.1:{port}", tmp_path / "metrics"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        log.close()


def requests_counted(text):
    return sum(float(value) for value in re.findall(
        r'^tokenwise_gateway_requests_total\{[^}]*endpoint="chat"[^}]*\} (\S+)$', text, re.M))


def test_metrics_add_up_every_web_process(two_process_server):
    process, base, metrics_dir = two_process_server
    serving = [child for child in psutil.Process(process.pid).children(recursive=True)
               if "spawn_main" in " ".join(child.cmdline())]
    assert len(serving) == 2, [child.cmdline() for child in psutil.Process(process.pid).children(recursive=True)]

    async def send_all():
        # Without a key each request is refused (401) before any database work, and counted all the same.
        limits = httpx.Limits(max_connections=40, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=base, timeout=10, limits=limits) as client:
            answers = await asyncio.gather(*[client.post("/v1/chat/completions", json={"model": "m"})
                                             for _ in range(60)])
        return [answer.status_code for answer in answers]

    assert set(run_coroutine(send_all())) == {401}
    # Each process keeps its own file of counters; every scrape, whichever process answers it, sees all 60.
    for _ in range(6):
        scraped = httpx.get(f"{base}/metrics", headers={"Connection": "close"}, timeout=10)
        assert scraped.status_code == 200
        assert requests_counted(scraped.text) == 60
    assert list(metrics_dir.glob("counter_*.db"))
