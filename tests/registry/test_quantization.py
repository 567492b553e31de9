"""Quantization jobs end to end: the form, a real Celery GPU worker, real AutoAWQ and llm-compressor on the CPU,
progress inside a layer, cancel, a runner killed mid-run, duplicate delivery, and the terminal command."""
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from panel.jobs import processes
from panel.jobs.models import JobEvent, JobState
from panel.registry import tasks
from panel.registry.models import QuantizationJob, RegisteredModel
from panel.registry.services import model_register, quantization_launch
from tests.support.environment import ROOT, panel_env
from tests.support.waiting import wait_until

FAST = {"max_calib_samples": 32, "max_calib_seq_len": 256, "backend": "autoawq", "scheme": "w4a16-awq"}
# The least calibration the form allows: for the tests of the job's path (worker, duplicate delivery, terminal),
# not of its quality. AWQ on a CPU costs per sample and grid point whatever the model's size (docs/benchmarks.md).
LEAST = {**FAST, "max_calib_samples": 8, "max_calib_seq_len": 64}


@pytest.fixture(scope="module")
def demo_model_path(tmp_path_factory):
    from panel.registry.demo_model import build_demo_model

    path = tmp_path_factory.mktemp("quantization") / "tiny"
    build_demo_model(path)
    return path


@pytest.fixture
def source(team_setup, demo_model_path):
    return model_register(team=team_setup["team_a"], user=team_setup["alice"], source=str(demo_model_path),
                          name="tiny")


def final(job, seconds=240):
    wait_until(lambda: QuantizationJob.objects.get(pk=job.pk).is_final, seconds=seconds, message="the job to end")
    job.refresh_from_db()
    return job


def wait_for_phase(job, text, seconds=120):
    """The job, once its phase mentions `text` (and its runner's process group is known)."""
    def reached():
        current = QuantizationJob.objects.get(pk=job.pk)
        return current if text in current.phase and current.pid else None

    return wait_until(reached, seconds=seconds, message=f"phase {text!r}")


def test_it_quantizes_the_demo_model_on_a_real_worker_once_when_its_message_comes_twice(start_worker, team_setup,
                                                                                         source):
    worker = start_worker("gpu")
    job = quantization_launch(team=team_setup["team_a"], user=team_setup["alice"], source=source, enqueue=False,
                              **LEAST)
    assert job.queue == "gpu"
    for _ in range(2):  # a duplicated delivery, as a broker may make
        tasks.run_quantization.apply_async(args=[job.pk], queue="gpu", task_id=f"quantize-{job.pk}")
    job = final(job)
    assert job.state == JobState.SUCCEEDED, (job.failure_kind, job.failure_reason, job.log_tail[-2000:])
    assert job.progress == 100
    assert "calibrating layer 4 of 4" in job.log_tail
    child = RegisteredModel.objects.get(parent=source)
    assert job.result_model == child and child.name == "tiny-awq-w4-g128"
    assert child.quantization["method"] == "awq" and child.quantization["bits"] == 4
    assert child.quantization["group_size"] == 128 and child.is_quantized
    assert child.path == job.output_dir and os.path.isdir(job.output_dir)
    assert job.result["size_after_bytes"] == child.size_bytes < source.size_bytes
    assert job.result["size_before_bytes"] == source.size_bytes
    assert 0.3 < child.size_reduction < 0.8
    assert job.result["peak_memory_bytes"] > 0 and job.result["seconds"] > 0
    assert child.parameter_count == source.parameter_count  # the same weights, packed
    wait_until(lambda: "duplicate delivery ignored" in worker.log(), seconds=60, message="the duplicate")
    assert JobEvent.objects.filter(job_id=job.pk, job_type="registry.quantizationjob",
                                   to_state=JobState.RUNNING).count() == 1
    assert RegisteredModel.objects.filter(parent=source).count() == 1


def test_it_cancels_a_running_job_within_ten_seconds(start_worker, team_setup, source):
    import time

    start_worker("gpu")
    job = quantization_launch(team=team_setup["team_a"], user=team_setup["alice"], source=source, **FAST)
    running = wait_for_phase(job, "calibrating")
    runner_group = running.pid
    assert processes.group_alive(runner_group)
    asked = time.monotonic()
    from panel.registry.services import quantization_cancel

    assert quantization_cancel(job=running, user=team_setup["alice"]) is True
    job = final(job, seconds=10)
    assert time.monotonic() - asked < 10
    assert job.state == JobState.CANCELLED
    assert not processes.group_alive(runner_group)
    assert not os.path.exists(job.output_dir) and not os.path.exists(job.output_dir + ".partial")
    assert not RegisteredModel.objects.filter(parent=source).exists()
    actors = JobEvent.objects.filter(job_id=job.pk, to_state=JobState.CANCELLING).values_list("actor", flat=True)
    assert list(actors) == [team_setup["alice"].pk]


def test_llm_compressor_reports_progress_inside_a_layer_and_cancels_within_ten_seconds(start_worker, team_setup,
                                                                                      source):
    import time

    from panel.registry.services import quantization_cancel

    start_worker("gpu")
    job = quantization_launch(team=team_setup["team_a"], user=team_setup["alice"], source=source,
                              scheme="w4a16-gptq", max_calib_samples=256, max_calib_seq_len=512)
    assert job.backend == "llm-compressor"
    running = wait_for_phase(job, "sample", seconds=180)
    # Four decoder layers and the head; each calibrated over every sample, then its outputs propagated.
    assert re.search(r"(calibrating|propagating) layer \d of 5, sample \d+ of \d+", running.phase), running.phase
    later = wait_until(lambda: (lambda j: j if "left" in j.phase else None)(QuantizationJob.objects.get(pk=job.pk)),
                       seconds=120, message="an estimate of the time left")
    assert re.search(r"about \d+ (s|min \d+ s) left", later.phase)
    asked = time.monotonic()
    assert quantization_cancel(job=later, user=team_setup["alice"]) is True
    job = final(job, seconds=10)
    assert time.monotonic() - asked < 10 and job.state == JobState.CANCELLED
    assert not processes.group_alive(later.pid)
    assert not os.path.exists(job.output_dir) and not os.path.exists(job.output_dir + ".partial")


def test_it_fails_with_a_reason_when_the_runner_is_killed(start_worker, team_setup, source):
    start_worker("gpu")
    job = quantization_launch(team=team_setup["team_a"], user=team_setup["alice"], source=source, **FAST)
    running = wait_for_phase(job, "calibrating")
    os.killpg(running.pid, signal.SIGKILL)
    job = final(job, seconds=30)
    assert job.state == JobState.FAILED
    assert job.failure_kind == "killed" and "signal 9" in job.failure_reason
    assert not processes.group_alive(running.pid)
    assert not os.path.exists(job.output_dir) and not os.path.exists(job.output_dir + ".partial")


@pytest.mark.parametrize("content, message", [
    (b"", "The submitted file is empty"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 300, "binary"),
    ("café au lait ".encode("latin-1") * 300, "not UTF-8"),
    (b"too short", "too little text"),
])
def test_it_refuses_a_bad_calibration_file_and_saves_nothing(client, team_setup, source, settings, content, message):
    client.force_login(team_setup["alice"])
    response = client.post(reverse("quantization_create", args=[source.pk]), {
        "scheme": "w4a16-awq", "backend": "autoawq", "keep_as": "bf16",
        "q_group_size": 128, "zero_point": "on", "version": "GEMM", "calibration": "file",
        "calibration_file": SimpleUploadedFile("domain.txt", content), "max_calib_samples": 128,
        "max_calib_seq_len": 512})
    assert response.status_code == 400
    assert message in response.content.decode()
    assert QuantizationJob.objects.count() == 0
    assert not (settings.DATA_DIR / "calibration" / str(team_setup["team_a"].pk)).exists()


@pytest.mark.parametrize("changes, message", [
    ({"q_group_size": 100}, "Select a valid choice"),
    ({"scheme": "w2a2"}, "Select a valid choice"),
    ({"max_calib_samples": 0}, "greater than or equal to 8"),
    ({"max_calib_seq_len": 10 ** 9}, "less than or equal to 4096"),
    ({"version": "FAST"}, "Select a valid choice"),
    ({"calibration": "file"}, "Choose a text file"),
])
def test_it_refuses_absurd_parameters(client, team_setup, source, changes, message):
    client.force_login(team_setup["alice"])
    data = {"scheme": "w4a16-awq", "keep_as": "bf16", "q_group_size": 128, "version": "GEMM",
            "calibration": "builtin", "max_calib_samples": 128, "max_calib_seq_len": 512}
    data.update(changes)
    response = client.post(reverse("quantization_create", args=[source.pk]), data)
    assert response.status_code == 400 and message in response.content.decode()
    assert QuantizationJob.objects.count() == 0


def test_it_refuses_to_quantize_a_quantized_model(client, team_setup, source):
    child = RegisteredModel.objects.create(
        team=source.team, name="already-awq", path=source.path, parent=source, architecture=source.architecture,
        model_type="qwen2", parameter_count=1, linear_parameter_count=1, num_layers=4, num_attention_heads=4,
        num_kv_heads=2, hidden_size=256, head_dim=64, max_position_embeddings=4096, dtype="float16", size_bytes=1,
        quantization={"method": "awq", "bits": 4, "group_size": 128})
    client.force_login(team_setup["alice"])
    response = client.post(reverse("quantization_create", args=[child.pk]), {
        "scheme": "w8a8-int8", "keep_as": "bf16", "q_group_size": 128, "version": "GEMM", "calibration": "builtin",
        "max_calib_samples": 128, "max_calib_seq_len": 512})
    assert response.status_code == 400
    assert "already quantized (AWQ 4-bit g128)" in response.content.decode()
    assert QuantizationJob.objects.count() == 0


def test_it_warns_about_large_groups(client, team_setup, source, django_capture_on_commit_callbacks):
    client.force_login(team_setup["alice"])
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post(reverse("quantization_create", args=[source.pk]), {
            "scheme": "w4a16-gptq", "keep_as": "bf16", "q_group_size": 256, "version": "GEMM",
            "calibration": "builtin", "max_calib_samples": 128, "max_calib_seq_len": 512}, follow=True)
    assert "Large groups cost accuracy" in response.content.decode()
    assert QuantizationJob.objects.get().q_group_size == 256


def test_it_quantizes_from_the_terminal(transactional_db, team_setup, source, tmp_path):
    from django.db import connection

    calibration = tmp_path / "domain.txt"
    calibration.write_text("\n\n".join(f"Invoice {i}: the customer asked about shipping, refunds and the "
                                       f"warranty of order number {i * 7}." for i in range(200)))
    env = panel_env(DATABASE_URL=f"sqlite:///{connection.settings_dict['NAME']}")
    result = subprocess.run([sys.executable, "manage.py", "quantize", "tiny", "--backend", "autoawq", "--scheme",
                             "w4a16-awq", "--no-report", "--calib", str(calibration),
                             "--max-calib-samples", "8", "--max-calib-seq-len", "64"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "100%" in result.stdout and "registered as tiny-awq-w4-g128" in result.stdout
    assert "perplexity" not in result.stdout  # --no-report
    job = QuantizationJob.objects.get()
    assert job.state == JobState.SUCCEEDED and job.worker == "terminal"
    assert job.calibration == "file" and job.result["calibration"]["source"] == "file"
    missing = subprocess.run([sys.executable, "manage.py", "quantize", "no-such-model"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "no registered model 'no-such-model'" in missing.stderr


def test_it_quantizes_with_llm_compressor_and_reports_quality_from_the_terminal(transactional_db, team_setup,
                                                                                 source):
    from django.db import connection

    env = panel_env(DATABASE_URL=f"sqlite:///{connection.settings_dict['NAME']}")
    result = subprocess.run([sys.executable, "manage.py", "quantize", "tiny", "--scheme", "w8a8-int8"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    assert "(W8A8 INT8, llm-compressor)" in result.stdout and "registered as tiny-w8a8-int8" in result.stdout
    measured = re.findall(r"^  \S+: perplexity [\d.]+, JSON answers \d+ of 12, other tasks \d+ of 18$", result.stdout,
                          re.MULTILINE)
    assert len(measured) == 2 and re.search(r"^W8A8 INT8: perplexity [+-][\d.]+%, .*: safe to serve\.$", result.stdout,
                                            re.MULTILINE), result.stdout[-2000:]
    job = QuantizationJob.objects.get()
    assert job.state == JobState.SUCCEEDED and job.result["quant_config"]["quant_method"] == "compressed-tensors"
    from panel.registry.models import EvaluationJob, ModelEvaluation

    report = EvaluationJob.objects.get(pk=job.result["quality_report"])
    assert report.state == JobState.SUCCEEDED and report.worker == "terminal"
    assert set(ModelEvaluation.objects.values_list("model__name", flat=True)) == {"tiny", "tiny-w8a8-int8"}


def test_it_leaves_no_runner_process_behind(demo_model_path):
    """After every job of this module (succeeded, cancelled, killed), no runner of its model is alive."""
    leftovers = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                 if str(demo_model_path) in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []
