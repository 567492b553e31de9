"""The one way Tokenwise runs a subprocess: its own process group, killed with its parent, output read line
by line, a time limit, and a stop check between lines. Engine runners and the vLLM server go through here."""
import ctypes
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from panel.env import names_read

PR_SET_PDEATHSIG = 1
# Engine scripts are modules of the top-level `engine` package, found from here with `python -m` (cwd = the root).
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def engine_argv(python, module, *args):
    """The command that runs `engine/<module>.py` with the engine venv's `python`; run it through this module."""
    return [str(python), "-m", f"engine.{module}", *(str(arg) for arg in args)]


# What an engine process gets from the worker's environment: what Python, vLLM, torch and CUDA read, never the
# panel's own settings (SECRET_KEY, TOKENWISE_ENCRYPTION_KEYS, DATABASE_URL...) or anything else of the worker's.
ENGINE_ENV_NAMES = ("PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME",
                    "LD_LIBRARY_PATH", "TOKENIZERS_PARALLELISM", "TQDM_DISABLE", "RAYON_NUM_THREADS")
ENGINE_ENV_PREFIXES = ("VLLM_", "CUDA_", "NVIDIA_", "NCCL_", "OMP_", "MKL_", "KMP_", "TORCH", "PYTORCH_", "TRITON_",
                       "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "XDG_CACHE_HOME")
ENGINE_ENV_SECRETS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY")
ENGINE_ENV_FIXED = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "HF_DATASETS_OFFLINE": "1"}


def engine_environment(extra=None):
    """The environment an engine process starts with: the allowed names of this process's environment, offline
    Hugging Face, then `extra` (the caller's own values: CUDA_VISIBLE_DEVICES, the engine's key). A name of the
    panel's own configuration never passes, even in `extra`."""
    own = names_read()
    env = {name: value for name, value in os.environ.items()
           if (name in ENGINE_ENV_NAMES or name.startswith(ENGINE_ENV_PREFIXES))
           and name not in ENGINE_ENV_SECRETS and name not in own}
    env.update(ENGINE_ENV_FIXED)
    env.update({name: str(value) for name, value in (extra or {}).items() if name not in own})
    return env


def _die_with_parent():
    # Runs in the child between fork and exec: if the worker that started us dies (even by SIGKILL),
    # the kernel sends us SIGKILL, so a lost worker leaves no orphan engine behind.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class ProcessOutcome:
    returncode: int | None
    stopped: bool = False  # we stopped it because should_stop() said so
    timed_out: bool = False
    tail: list = field(default_factory=list)


def start(argv, *, env=None, cwd=None, log_file=None):
    """Start `argv` in a new session (its own process group) that dies with this process, with the engine
    environment (`engine_environment`) plus `env`."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=engine_environment(env),
        cwd=cwd or PROJECT_ROOT,
        start_new_session=True,
        preexec_fn=_die_with_parent,
        text=True,
        bufsize=1,
        errors="replace",
    )


def group_alive(pgid):
    """Whether a process of the group still runs. A zombie (dead, not yet reaped by its parent: an engine's helper
    orphaned by a SIGKILL waits for PID 1, which took about 2 s on these machines) does not count."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(_runs_in_group(pid, pgid) for pid in psutil.pids())


def _runs_in_group(pid, pgid):
    try:
        return os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, PermissionError, psutil.Error):
        return False


def stop_group(pgid, *, grace_seconds=10.0):
    """SIGTERM the process group, then SIGKILL whatever is left after `grace_seconds`."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_streaming(argv, *, on_line, tick, tick_every=5.0, time_limit=None, env=None, cwd=None, log_path=None,
                  grace_seconds=10.0, on_start=None, tail_lines=50):
    """Run `argv` to the end, calling `on_line(line)` for each output line and `tick()` every `tick_every`
    seconds (and after each burst of lines). `tick()` returning True stops the process group.
    Returns a ProcessOutcome. Whatever happens, no process of the group is left running."""
    process = start(argv, env=env, cwd=cwd)
    if on_start is not None:
        on_start(process.pid)
    lines = queue.Queue()

    def pump():
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    outcome = ProcessOutcome(returncode=None)
    started = time.monotonic()
    next_tick = started + tick_every
    log_file = open(log_path, "a", encoding="utf-8") if log_path else None
    try:
        finished_output = False
        while True:
            timeout = max(0.0, min(next_tick - time.monotonic(), 0.5))
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                line = ""
            if line is None:
                finished_output = True
            elif line:
                if log_file:
                    log_file.write(line)
                outcome.tail = (outcome.tail + [line.rstrip("\n")])[-tail_lines:]
                on_line(line.rstrip("\n"))
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + tick_every
                if tick():
                    outcome.stopped = True
                    break
            if time_limit is not None and now - started > time_limit:
                outcome.timed_out = True
                break
            if finished_output:
                break
    finally:
        if log_file:
            log_file.close()
        if process.poll() is None and (outcome.stopped or outcome.timed_out):
            stop_group(process.pid, grace_seconds=grace_seconds)
        try:
            outcome.returncode = process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            stop_group(process.pid, grace_seconds=0)
            outcome.returncode = process.wait()
        # Grandchildren that outlived the runner (an engine's helper processes) share its group.
        if group_alive(process.pid):
            stop_group(process.pid, grace_seconds=grace_seconds)
    return outcome
