"""The tiny demo model: a Qwen2 checkpoint with random weights that the project builds itself, because no
machine here reaches a model hub (DESIGN.md, "No downloads at run time"). engine/build_demo_model.py builds it
inside the engine venv; this module runs that script and reads its JSON lines. Built once, then reused."""
import os
import shutil
from pathlib import Path

from django.conf import settings

from panel.jobs import processes
from panel.jobs.runner import parse_line

DEMO_MODEL_DIRNAME = "tokenwise-tiny-qwen2"
# A build takes seconds; minutes means the engine venv is wedged (importing torch from a stalled disk).
BUILD_TIME_LIMIT_SECONDS = 600


class DemoModelError(Exception):
    """The demo model could not be built; the message says why, in words."""


def default_demo_model_path():
    """Where the demo model lives unless told otherwise: MODELS_DIR/tokenwise-tiny-qwen2."""
    return Path(settings.MODELS_DIR) / DEMO_MODEL_DIRNAME


def engine_python():
    """The engine venv's interpreter as an existing path, or DemoModelError naming where it was looked for."""
    configured = str(settings.ENGINE_PYTHON)
    # A bare command name ("python3") is looked up on PATH; anything with a slash is taken as a path.
    found = shutil.which(configured) if os.sep not in configured else configured
    if not found or not Path(found).is_file() or not os.access(found, os.X_OK):
        raise DemoModelError(
            f"engine venv not found at {configured}: `make run` or `make engine` builds it, or point "
            f"ENGINE_PYTHON at the python of an engine venv"
        )
    return found


def builder_argv(path, *, force):
    argv = processes.engine_argv(engine_python(), "build_demo_model", path)
    if force:
        argv.append("--force")
    return argv


def describe_progress(message):
    percent = message.get("progress")
    prefix = f"[{int(percent):3d}%] " if isinstance(percent, (int, float)) else ""
    return f"{prefix}{message['phase']}"


def build_demo_model(path=None, *, force=False, on_progress=None):
    """Build the demo model at `path` (default: default_demo_model_path()) unless a complete one is there, or
    always with `force`. `on_progress(text)` gets one readable line per phase. Returns the builder's result:
    {"path", "parameters", "size_bytes", "seconds", "reused", ...}. Raises DemoModelError on any failure."""
    path = Path(path) if path else default_demo_model_path()
    argv = builder_argv(path.absolute(), force=force)
    said = {}

    def on_line(line):
        message = parse_line(line)
        if message is None:
            return  # library chatter (warnings, progress bars): kept in the outcome's tail for errors
        for key in ("result", "error"):
            if isinstance(message.get(key), dict):
                said[key] = message[key]
        if "phase" in message and on_progress is not None:
            on_progress(describe_progress(message))

    outcome = processes.run_streaming(argv, on_line=on_line, tick=lambda: False,
                                      time_limit=BUILD_TIME_LIMIT_SECONDS)
    return result_or_raise(outcome, said)


def result_or_raise(outcome, said):
    if outcome.timed_out:
        raise DemoModelError(f"building the demo model took longer than {BUILD_TIME_LIMIT_SECONDS} s; stopped")
    if "error" in said:
        raise DemoModelError(f"building the demo model failed: {said['error'].get('reason', 'no reason given')}")
    if outcome.returncode != 0 or "result" not in said:
        last_lines = "\n".join(outcome.tail[-10:]) or "(no output)"
        raise DemoModelError(
            f"the demo model builder exited with status {outcome.returncode} and no result; last output:\n"
            f"{last_lines}"
        )
    return said["result"]
