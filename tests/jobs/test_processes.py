"""The subprocess helper: own process group, output line by line, stop, time limit, death with the parent."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from panel.jobs.processes import group_alive, run_streaming
from tests.support.environment import ROOT, panel_env
from tests.support.waiting import wait_until

CHILD_AND_GRANDCHILD = textwrap.dedent("""
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    for i in range(3):
        print(f"line {i}", flush=True)
    time.sleep(600)
""")


def test_it_streams_lines_and_returns_the_exit_code():
    lines = []
    outcome = run_streaming([sys.executable, "-c", "print('a'); print('b'); raise SystemExit(3)"],
                            on_line=lines.append, tick=lambda: False, tick_every=0.2)
    assert lines == ["a", "b"]
    assert outcome.returncode == 3 and not outcome.stopped and outcome.tail == ["a", "b"]


def test_it_stops_the_whole_group_when_asked():
    lines, pids = [], []
    outcome = run_streaming([sys.executable, "-c", CHILD_AND_GRANDCHILD], on_line=lines.append,
                            tick=lambda: len(lines) >= 3, tick_every=0.2, on_start=pids.append, grace_seconds=2)
    assert outcome.stopped
    assert lines == ["line 0", "line 1", "line 2"]
    assert not group_alive(pids[0])


def test_it_enforces_the_time_limit():
    pids = []
    started = time.monotonic()
    outcome = run_streaming([sys.executable, "-c", CHILD_AND_GRANDCHILD], on_line=lambda line: None,
                            tick=lambda: False, tick_every=0.2, time_limit=1, on_start=pids.append, grace_seconds=2)
    assert outcome.timed_out
    assert time.monotonic() - started < 10
    assert not group_alive(pids[0])


def test_it_dies_with_the_process_that_started_it(tmp_path):
    pid_file = tmp_path / "pid"
    parent = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from panel.jobs.processes import start
        process = start([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(process.pid))
        import time; time.sleep(600)
    """)
    runner = subprocess.Popen([sys.executable, "-c", parent], env=panel_env())
    child_pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), message="child pid"))
    assert psutil.pid_exists(child_pid)
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()
    wait_until(lambda: not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == "zombie",
               seconds=5, message="the orphan to die")


def test_a_group_of_only_zombies_is_not_alive():
    """An engine killed with its group leaves zombies until their parent reaps them (an orphan waits for PID 1):
    the supervisor must not wait for that to see the engine gone."""
    leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], process_group=0)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"], process_group=leader.pid)  # not reaped yet
    try:
        wait_until(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, seconds=10,
                   message="the helper exited")
        assert group_alive(leader.pid)  # the leader runs
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait(timeout=5)
        assert psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE  # still in the group, dead
        assert not group_alive(leader.pid)
    finally:
        zombie.wait(timeout=5)
        if leader.poll() is None:
            leader.kill()
            leader.wait()
