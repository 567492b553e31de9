"""The demo LoRA adapter: a real PEFT adapter of rank 8 that engine/build_lora_adapter.py trains on the demo model
(panel/registry/demo_model.py) to answer one question with a fixed phrase, so that its answers differ from the
base's. Trained once and cached under the data dir like the demo model, keyed by the trainer's source, the demo
model's build and the phrase; every other folder that asks for it gets a copy."""
import hashlib
import json
import shutil
from pathlib import Path

from django.conf import settings

from panel.jobs import processes
from panel.jobs.runner import run_for_result
from panel.registry.demo_model import (
    DemoModelError,
    build_demo_model,
    building_lock,
    copy_build,
    engine_python,
)
from panel.registry.demo_model import cache_path as demo_model_cache

BUILD_TIME_LIMIT_SECONDS = 600
REQUIRED = ("adapter_config.json", "adapter_model.safetensors", "training.json")
PHRASE = "The Tokenwise adapter answers: forty-two."


def cache_path(phrase=PHRASE, base=None, training=()):
    digest = hashlib.sha256((processes.PROJECT_ROOT / "engine" / "build_lora_adapter.py").read_bytes())
    digest.update((Path(base).name if base is not None else demo_model_cache().name).encode())
    digest.update(" ".join(training).encode())
    digest.update(phrase.encode())
    return Path(settings.DATA_DIR) / "cache" / f"demo-adapter-{digest.hexdigest()[:12]}"


def is_built(path):
    return path.is_dir() and all((path / name).is_file() for name in REQUIRED)


def build_demo_adapter(path, *, phrase=PHRASE, base=None, steps=None, learning_rate=None):
    """A copy of the cached demo adapter at `path` (trained first where the cache has none, on the cached demo
    model, built first where there is none; or on `base`, a model folder named uniquely for its weights, such as a
    GGUF import's cached conversion, with the trainer's `steps` and `learning_rate` where its defaults do not suit
    it); returns its training.json: the question, the phrase, the base's and the adapter's greedy answers. Raises
    DemoModelError on any failure."""
    path = Path(path)
    training = (*(("--steps", str(steps)) if steps else ()),
                *(("--learning-rate", str(learning_rate)) if learning_rate else ()))
    cached = cache_path(phrase, base, training)
    with building_lock(cached):
        if not is_built(cached):
            if base is None:
                scratch = cached.parent / f".{cached.name}-scratch"
                build_demo_model(scratch)  # fills the demo model's cache, which the adapter is trained on
                shutil.rmtree(scratch, ignore_errors=True)
            run_trainer(Path(base) if base is not None else demo_model_cache(), cached, phrase, training)
    if not is_built(path):
        copy_build(cached, path)
    return json.loads((path / "training.json").read_text())


def run_trainer(base, out, phrase, training=()):
    argv = processes.engine_argv(engine_python(), "build_lora_adapter", "--base", base.absolute(), "--out",
                                 out.absolute(), "--phrase", phrase, *training)
    outcome, said = run_for_result(argv, time_limit=BUILD_TIME_LIMIT_SECONDS)
    if "error" in said:
        raise DemoModelError(f"training the demo adapter failed: {said['error'].get('reason', 'no reason given')}")
    if outcome.returncode != 0 or "result" not in said:
        raise DemoModelError(f"the demo adapter trainer exited with status {outcome.returncode} and no result; last "
                             "output:\n" + ("\n".join(outcome.tail[-10:]) or "(no output)"))
    return said["result"]
