"""engine/quantize_runner.py, run as the workers run it: a subprocess of the engine venv's Python speaking JSON
lines. The demo model (Qwen2, 4 layers, hidden 256) is quantized to 4-bit AWQ on the CPU once per module; the
checkpoint is then read back tensor by tensor and dequantized by an independent script (tests/support/engine/), and the
failures a user can cause are each classified, with nothing left on disk."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from panel.registry.demo_model import build_demo_model

pytestmark = pytest.mark.engine

ROOT = Path(settings.BASE_DIR)
DEQUANT_CHECK = ROOT / "tests" / "support" / "engine" / "awq_dequant_check.py"
LAYERS = 4  # the demo model's decoder layers
GROUP = 128
PACK = 8  # 4-bit values in one int32

# Bounds for the dequantization check, ||W_deq - W diag(s)||_F / ||W diag(s)||_F with s fitted per input column.
# 4-bit asymmetric quantization of a group of 128 Gaussian weights: the expected range of 128 normal samples is
# about 2 x 2.6 sigma, so the step is about 5.2 sigma / 15 = 0.35 sigma and the rounding error's RMS is
# step / sqrt(12) = 0.10 sigma: a relative error of about 0.10. The check script's plain round-to-nearest baseline
# measures 0.100-0.102 on the demo weights; AWQ measured 0.100-0.114 with a column fit (up_proj is highest: its
# rows were also divided by down_proj's scales, which a column fit cannot express) and at most 0.106 with a row
# and column fit (on the H200, a Qwen2.5-1.5B-shaped model: column fit max 0.129, row and column fit max 0.101;
# docs/benchmarks.md). Since the demo model is trained its weights are no longer Gaussian: the column fit's worst
# linear (up_proj again) measured 0.132, so the column fit bounds the mean and only the row and column fit bounds
# every linear. Nibbles unpacked in the wrong order measure 1.8-4.0, unscaled weights 0.16-0.19. Below 0.05
# would mean the weights were not really quantized to 4 bits.
MAX_REL_ERROR = 0.13
MAX_TWO_SIDED_REL_ERROR = 0.12
MIN_REL_ERROR = 0.05
MAX_OVER_ROUND_TO_NEAREST = 1.25  # AWQ against plain rounding of the same weights (measured 1.04)
MAX_NORM_FOLD_DEVIATION = 0.10  # fitted s against the RMSNorm weights it was folded into (measured 0.03)


def runner_argv(model, out, *extra, calib="builtin", samples=4):
    return [str(settings.ENGINE_PYTHON), "-m", "engine.quantize_runner", "--model", str(model), "--out", str(out),
            "--w-bit", "4", "--group-size", str(GROUP), "--version", "GEMM", "--calib", str(calib),
            "--max-calib-samples", str(samples), "--max-calib-seq-len", "512", *extra]


def run_runner(model, out, *extra, timeout=300, **options):
    completed = subprocess.run(runner_argv(model, out, *extra, **options), capture_output=True, text=True,
                               timeout=timeout, cwd=ROOT)
    messages = []
    for line in completed.stdout.splitlines():
        if line.startswith("{"):
            messages.append(json.loads(line))
    return completed, messages


def the_error(completed, messages):
    errors = [message["error"] for message in messages if "error" in message]
    assert completed.returncode == 1, (completed.returncode, completed.stdout[-2000:], completed.stderr[-2000:])
    assert len(errors) == 1, messages
    assert not [message for message in messages if "result" in message]
    return errors[0]


def assert_nothing_left(out):
    assert not out.exists()
    assert not out.with_name(out.name + ".partial").exists()


def safetensors_header(path):
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    header.pop("__metadata__", None)
    return header


def folder_bytes(path):
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = tmp_path_factory.mktemp("source") / "tiny-qwen2"
    build_demo_model(path)
    return path


@pytest.fixture(scope="module")
def quantized(demo, tmp_path_factory):
    """The demo model quantized once, with the builtin corpus: (out_dir, completed, messages, seconds)."""
    out = tmp_path_factory.mktemp("quantized") / "tiny-qwen2-awq"
    started = time.monotonic()
    completed, messages = run_runner(demo, out)
    return out, completed, messages, time.monotonic() - started


def test_it_quantizes_the_demo_model_end_to_end(demo, quantized):
    out, completed, messages, seconds = quantized
    assert completed.returncode == 0, (completed.stdout[-3000:], completed.stderr[-3000:])
    assert not out.with_name(out.name + ".partial").exists()

    phases = [message["phase"] for message in messages if "phase" in message]
    layer_phases = [phase for phase in phases if phase.startswith("calibrating layer")]
    assert layer_phases == [f"calibrating layer {i} of {LAYERS}" for i in range(1, LAYERS + 1)]
    assert phases.index("loading model") < phases.index("calibrating layer 1 of 4") < phases.index("saving")
    assert "preparing calibration data" in phases
    progress = [message["progress"] for message in messages if "progress" in message]
    assert progress == sorted(progress) and 0 < progress[0] and progress[-1] <= 100
    layer_progress = [message["progress"] for message in messages
                      if message.get("phase", "").startswith("calibrating layer")]
    assert layer_progress[0] >= 10 and layer_progress[-1] <= 90 and len(set(layer_progress)) == LAYERS
    assert list(messages[-1]) == ["result"]  # the result is the last line

    result = messages[-1]["result"]
    assert result["output_path"] == str(out)
    assert result["layers"] == LAYERS
    assert result["device"] == "cpu" and result["peak_memory_kind"] == "cpu"
    assert 50 * 2**20 < result["peak_memory_bytes"] < 16 * 2**30
    assert 0 < result["seconds"] < seconds
    calibration = result["calibration"]
    assert calibration["source"] == "builtin" and calibration["samples"] == 4
    assert 512 <= calibration["tokens"] < 4 * 512
    assert result["quant_config"] == {"bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
                                      "quant_method": "awq", "modules_to_not_convert": None}
    # Sizes as the files say: the source is 10.8 MB of bf16; the quantized layers shrink, embeddings stay bf16.
    assert result["size_before_bytes"] == folder_bytes(demo)
    assert result["size_after_bytes"] == folder_bytes(out)
    assert result["size_after_bytes"] < 0.7 * result["size_before_bytes"]

    config = json.loads((out / "config.json").read_text())
    quantization = config["quantization_config"]
    assert quantization["quant_method"] == "awq" and quantization["bits"] == 4
    assert quantization["group_size"] == 128 and quantization["zero_point"] is True
    assert quantization["version"] == "gemm"

    # The tokenizer and the original generation config came along; every file is readable by others.
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (demo / name).read_bytes(), name
    assert {item.name: item.stat().st_mode & 0o777 for item in out.iterdir()} == {
        item.name: 0o644 for item in out.iterdir()}
    assert not list(out.glob(".quantize_runner.pid"))

    # Every decoder linear is packed for the GEMM kernel: qweight [in, out/8] int32, qzeros [in/128, out/8]
    # int32, scales [in/128, out] fp16; no full-precision weight is left for it.
    source = {name: entry for name, entry in safetensors_header(demo / "model.safetensors").items()}
    header = safetensors_header(out / "model.safetensors")
    linears = sorted(name[: -len(".weight")] for name in source
                     if name.startswith("model.layers.") and name.endswith("_proj.weight"))
    assert len(linears) == 7 * LAYERS
    for base in linears:
        out_features, in_features = source[base + ".weight"]["shape"]
        assert base + ".weight" not in header, base
        assert header[base + ".qweight"]["dtype"] == "I32", base
        assert header[base + ".qweight"]["shape"] == [in_features, out_features // PACK], base
        assert header[base + ".qzeros"]["dtype"] == "I32", base
        assert header[base + ".qzeros"]["shape"] == [in_features // GROUP, out_features // PACK], base
        assert header[base + ".scales"]["dtype"] == "F16", base
        assert header[base + ".scales"]["shape"] == [in_features // GROUP, out_features], base
    assert header["model.embed_tokens.weight"]["shape"] == source["model.embed_tokens.weight"]["shape"]


def test_it_dequantizes_close_to_the_original_weights(demo, quantized):
    out, completed, _, _ = quantized
    assert completed.returncode == 0, completed.stderr[-3000:]
    check = subprocess.run([str(settings.ENGINE_PYTHON), str(DEQUANT_CHECK), str(demo), str(out)],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr[-3000:]
    numbers = json.loads(check.stdout.strip().splitlines()[-1])
    print({key: value for key, value in numbers.items() if key != "per_linear"})

    assert numbers["linears"] == 7 * LAYERS
    assert numbers["q_range"] == [0, 15]  # all sixteen 4-bit levels in use
    assert MIN_REL_ERROR < numbers["mean_rel_error"] < MAX_REL_ERROR, numbers
    assert numbers["mean_rel_error"] <= numbers["max_rel_error"] < numbers["max_unscaled_rel_error"], numbers
    assert MIN_REL_ERROR < numbers["max_two_sided_rel_error"] < MAX_TWO_SIDED_REL_ERROR, numbers
    assert numbers["max_two_sided_rel_error"] < MAX_OVER_ROUND_TO_NEAREST * numbers["max_rtn_rel_error"]
    # AWQ really scaled the input channels (the unscaled comparison is worse) ...
    assert numbers["max_unscaled_rel_error"] > numbers["max_rel_error"]
    low, high = numbers["scale_range"]
    assert 0.2 < low < 1 < high < 5
    # ... and the scales it found are the inverse of what it folded into the RMSNorms.
    assert numbers["norm_fold_checks"] == 5 * LAYERS
    assert numbers["norm_fold_max_median_rel_dev"] < MAX_NORM_FOLD_DEVIATION


def test_it_refuses_an_already_quantized_model(quantized, tmp_path):
    source, completed, _, _ = quantized
    assert completed.returncode == 0
    out = tmp_path / "twice"
    completed, messages = run_runner(source, out)
    error = the_error(completed, messages)
    assert error["kind"] == "already_quantized" and "awq" in error["reason"], error
    assert_nothing_left(out)

    # The older marker file alone says the same.
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (legacy / "quantize_config.json").write_text(json.dumps({"bits": 4}))
    completed, messages = run_runner(legacy, tmp_path / "legacy-out")
    assert the_error(completed, messages)["kind"] == "already_quantized"
    assert_nothing_left(tmp_path / "legacy-out")


def test_it_refuses_an_architecture_autoawq_does_not_know(tmp_path):
    model = tmp_path / "strange"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "tokenwise_strange", "hidden_size": 256}))
    out = tmp_path / "strange-awq"
    completed, messages = run_runner(model, out)
    error = the_error(completed, messages)
    assert error["kind"] == "unsupported_architecture", error
    assert "tokenwise_strange" in error["reason"] and "qwen2" in error["reason"] and "llama" in error["reason"]
    assert_nothing_left(out)


def test_it_refuses_bad_calibration_files(demo, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"some text\n" + bytes(range(256)) * 8)
    short = tmp_path / "short.txt"
    short.write_text("A short note about invoices.\n\nAnother line about refunds.\n")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Caf\xe9 cr\xe8me, na\xefve r\xe9sum\xe9.\n".encode("latin-1") * 50)
    cases = [(empty, "empty"), (binary, "NUL"), (short, "only"), (latin1, "UTF-8"),
             (tmp_path / "missing.txt", "does not exist")]
    for calib, words in cases:
        out = tmp_path / f"out-{calib.stem}"
        completed, messages = run_runner(demo, out, calib=calib)
        error = the_error(completed, messages)
        assert error["kind"] == "bad_calibration", (calib, error)
        assert words in error["reason"] and str(calib) in error["reason"], (calib, error)
        assert_nothing_left(out)
        if calib == short:  # read and tokenized: the reason counts its tokens against the 512 needed
            assert "512" in error["reason"], error


def test_it_refuses_an_existing_output_folder(demo, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    completed, messages = run_runner(demo, out)
    error = the_error(completed, messages)
    assert error["kind"] == "failed" and "already exists" in error["reason"], error
    assert (out / "keep.txt").read_text() == "mine"
    assert not out.with_name(out.name + ".partial").exists()


def test_it_leaves_nothing_behind_when_stopped_by_sigterm(demo, tmp_path):
    out = tmp_path / "stopped"
    partial = out.with_name(out.name + ".partial")
    process = subprocess.Popen(runner_argv(demo, out, samples=8), stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        seen = []
        for line in process.stdout:
            seen.append(line)
            if '"calibrating layer' in line:
                break
        assert any('"calibrating layer 1 of 4"' in line for line in seen), seen
        assert partial.is_dir()  # the run is writing: there is something to clean up
        process.send_signal(signal.SIGTERM)
        rest = process.stdout.read()
        returncode = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert returncode == 1
    error = json.loads([line for line in rest.splitlines() if line.startswith('{"error"')][-1])["error"]
    assert error["kind"] == "failed" and "SIGTERM" in error["reason"], error
    assert '"result"' not in rest
    assert_nothing_left(out)


def test_it_removes_what_a_killed_run_left_behind(demo, tmp_path):
    """A run killed with SIGKILL cannot clean up: the next run to the same folder removes the stale partial
    folder (its pid is gone) instead of refusing for ever."""
    out = tmp_path / "again"
    partial = out.with_name(out.name + ".partial")
    partial.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (partial / ".quantize_runner.pid").write_text(str(dead.pid))
    (partial / "model.safetensors").write_bytes(b"half")
    calib = tmp_path / "short.txt"
    calib.write_text("too short to calibrate anything")
    completed, messages = run_runner(demo, out, calib=calib)
    # It got past the output checks (the stale folder was no obstacle) to the calibration text, then cleaned up.
    assert the_error(completed, messages)["kind"] == "bad_calibration"
    assert_nothing_left(out)
    assert os.listdir(tmp_path) == ["short.txt"]


# Every engine module a worker runs (each has a main): --help answers, a bad argument is one error line.
RUNNERS = sorted(path.stem for path in (ROOT / "engine").glob("*.py")
                 if 'if __name__ == "__main__":' in path.read_text())


def test_every_runner_is_checked():
    assert {"engine_probe", "gguf_import", "model_check", "llmc_quantize", "quantize_runner"} <= set(RUNNERS)


@pytest.mark.parametrize("module", RUNNERS)
def test_help_exits_0_without_an_error_line(module):
    completed = subprocess.run([str(settings.ENGINE_PYTHON), "-m", f"engine.{module}", "--help"], capture_output=True,
                               text=True, timeout=120, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "usage:" in completed.stdout and '"error"' not in completed.stdout
    assert '"result"' not in completed.stdout  # it answered the question and did nothing else


@pytest.mark.parametrize("module", RUNNERS)
def test_bad_arguments_are_one_error_line_and_exit_1(module):
    completed = subprocess.run([str(settings.ENGINE_PYTHON), "-m", f"engine.{module}", "--no-such-option"],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    assert completed.returncode == 1
    assert len(lines) == 1 and lines[0]["error"]["kind"] == "failed"
    assert lines[0]["error"]["reason"].startswith("bad arguments:")


WITHOUT_BF16 = {"ONEDNN_MAX_CPU_ISA": "AVX2"}  # oneDNN held to AVX2: bf16 runs emulated, as on an AVX2-only EPYC


@pytest.mark.parametrize("argv", [
    ["-m", "engine.quantize_runner", "--w-bit", "4", "--group-size", str(GROUP), "--max-calib-samples", "2",
     "--max-calib-seq-len", "128"],
    ["-m", "engine.llmc_quantize", "--scheme", "w8a8-int8", "--max-calib-samples", "2", "--max-calib-seq-len", "128"],
], ids=["autoawq", "llm-compressor"])
def test_a_cpu_without_bf16_arithmetic_computes_in_float32_and_writes_bf16(demo, tmp_path, argv):
    """Where bf16 is emulated (about ten times slower than float32), both quantizers compute in float32 and write
    the checkpoint's own dtype: no float32 tensor in the output, config.json still bfloat16."""
    out = tmp_path / "out"
    completed = subprocess.run([str(settings.ENGINE_PYTHON), *argv, "--model", str(demo), "--out", str(out)],
                               capture_output=True, text=True, timeout=300, cwd=ROOT,
                               env={**os.environ, **WITHOUT_BF16})
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert "computing in float32: this CPU has no bf16 arithmetic" in completed.stdout
    dtypes = {entry["dtype"] for entry in safetensors_header(out / "model.safetensors").values()}
    assert "BF16" in dtypes and "F32" not in dtypes, dtypes
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
