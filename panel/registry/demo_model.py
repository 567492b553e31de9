"""The tiny demo model: a Qwen2 checkpoint that the project builds and briefly trains itself, because no machine
here reaches a model hub (DESIGN.md, "No downloads at run time"). engine/build_demo_model.py builds it inside the
engine venv; this module runs that script and reads its JSON lines.

Training takes about a minute, so a build goes into a cache under the data dir, keyed by the builder's own source
files, and every other folder that asks for the demo model gets a copy of it (a test run trains it once)."""
import fcntl
import hashlib
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from panel.jobs import processes
from panel.jobs.runner import run_for_result

DEMO_MODEL_DIRNAME = "tokenwise-tiny-qwen2"
# A build takes about a minute (most of it training); ten means the engine venv is wedged.
BUILD_TIME_LIMIT_SECONDS = 600
BUILDER_SOURCES = ("build_demo_model.py", "demo_training.py", "evaluation_text.py")


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


def builder_argv(path, *, force, steps=None):
    argv = processes.engine_argv(engine_python(), "build_demo_model", path)
    if force:
        argv.append("--force")
    if steps:
        argv += ["--steps", str(steps)]
    return argv


def describe_progress(message):
    percent = message.get("progress")
    prefix = f"[{int(percent):3d}%] " if isinstance(percent, (int, float)) else ""
    return f"{prefix}{message['phase']}"


def cache_path():
    """Where the cached build lives: one folder per version of the builder's sources."""
    digest = hashlib.sha256()
    for name in BUILDER_SOURCES:
        digest.update((processes.PROJECT_ROOT / "engine" / name).read_bytes())
    return Path(settings.DATA_DIR) / "cache" / f"demo-model-{digest.hexdigest()[:12]}"


def build_demo_model(path=None, *, force=False, steps=None, on_progress=None):
    """Build the demo model at `path` (default: default_demo_model_path()) unless a complete one is there: a copy
    of the cached build (trained once), or always a fresh build with `force`, trained for `steps` optimizer steps
    when given (fewer: a quicker, weaker model). `on_progress(text)` gets one readable line per phase. Returns the
    builder's result: {"path", "parameters", "size_bytes", "seconds", "reused", "training", ...}.
    Raises DemoModelError on any failure."""
    path = Path(path) if path else default_demo_model_path()
    if steps and not force:
        raise DemoModelError("a build with its own number of training steps is always a fresh build (force)")
    engine_python()  # no engine venv: say so before copying anything
    if not force and not is_built(path):
        cached = cache_path()
        with building_lock(cached):  # a second process building at once waits, then copies the first one's build
            if not is_built(cached):
                run_builder(cached, force=False, on_progress=on_progress)
        copy_build(cached, path)
    return run_builder(path, force=force, steps=steps, on_progress=on_progress)


@contextmanager
def building_lock(cached):
    """Held while the cached build is checked and built: two workers (or a worker and the launcher) on one host that
    build at the same moment train the model once. The wait ends a little after the builder's own time limit."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + BUILD_TIME_LIMIT_SECONDS + 60
    with open(cached.parent / f".{cached.name}.lock", "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DemoModelError("another process has been building the demo model for too long") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def is_built(path):
    """A complete build is there (the builder's own check, by its files; no engine needed to look)."""
    required = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "training.json")
    return path.is_dir() and all((path / name).is_file() for name in required)


def copy_build(source, target):
    """Copy a complete build to `target` through a sibling folder and a rename (`target` is never half there)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{target.name}.copying-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)


def run_builder(path, *, force, on_progress, steps=None):
    def progress(message):
        if "phase" in message and on_progress is not None:
            on_progress(describe_progress(message))

    outcome, said = run_for_result(builder_argv(path.absolute(), force=force, steps=steps),
                                   time_limit=BUILD_TIME_LIMIT_SECONDS, on_message=progress)
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
