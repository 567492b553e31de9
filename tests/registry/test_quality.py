"""Quantization schemes and quality reports without an engine: what a host serves (from its engine check), the
expected size from a checkpoint's own tensors, the comparison and its flags, the forms that refuse what cannot
be served and save nothing, and the built-in evaluation inputs kept apart from training and calibration."""
import json

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from engine import awq_calibration, evaluation_text, quality_tasks, quant_schemes
from engine import build_demo_model as builder
from panel.hosts.models import EngineCheck, WorkerHost
from panel.registry import schemes
from panel.registry.models import EvaluationJob, ModelEvaluation, QuantizationJob, RegisteredModel
from panel.registry.quality import (
    compare,
    evaluation_launch,
    prompt_file_check,
    quality_flags,
    quality_report,
    quality_verdict,
)
from tests.support.safetensors import write_safetensors

CPU_AVX512 = {"kernels": {"int8_scaled_mm": True, "w4a16": True, "fp8": True}, "cuda_devices": [],
              "serves_awq": True, "fp8_checked_by": "multiplication"}
CPU_AVX2 = {"kernels": {"int8_scaled_mm": True, "w4a16": False, "fp8": False}, "cuda_devices": [],
            "serves_awq": False, "fp8_checked_by": "multiplication"}
OLD_CHECK = {"kernels": {"int8_scaled_mm": True, "w4a16": True, "fp8": True}, "cuda_devices": []}  # FP8 by op name
H200 = {"kernels": {"int8_scaled_mm": True, "w4a16": True, "fp8": True}, "serves_awq": True,
        "cuda_devices": [{"index": 0, "name": "NVIDIA H200", "memory_bytes": 150e9, "compute_capability": 9.0}]}
A100 = {"kernels": {}, "cuda_devices": [{"index": 0, "name": "A100", "memory_bytes": 80e9, "compute_capability": 8.0}]}

SHAPE = {"hidden": 256, "intermediate": 768, "kv": 128, "vocab": 4096, "layers": 2}


@pytest.fixture
def checkpoint(tmp_path):
    """A two-block Qwen2-shaped checkpoint (zero weights): enough for sizes and layer names."""
    h, i, kv, v = SHAPE["hidden"], SHAPE["intermediate"], SHAPE["kv"], SHAPE["vocab"]
    tensors = {"model.embed_tokens.weight": ("BF16", [v, h]), "lm_head.weight": ("BF16", [v, h]),
               "model.norm.weight": ("BF16", [h])}
    for layer in range(SHAPE["layers"]):
        prefix = f"model.layers.{layer}"
        tensors.update({
            f"{prefix}.self_attn.q_proj.weight": ("BF16", [h, h]),
            f"{prefix}.self_attn.k_proj.weight": ("BF16", [kv, h]),
            f"{prefix}.self_attn.v_proj.weight": ("BF16", [kv, h]),
            f"{prefix}.self_attn.o_proj.weight": ("BF16", [h, h]),
            f"{prefix}.mlp.gate_proj.weight": ("BF16", [i, h]), f"{prefix}.mlp.up_proj.weight": ("BF16", [i, h]),
            f"{prefix}.mlp.down_proj.weight": ("BF16", [h, i]), f"{prefix}.input_layernorm.weight": ("BF16", [h]),
        })
    write_safetensors(tmp_path / "model.safetensors", tensors)
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": h, "intermediate_size": i,
        "num_hidden_layers": SHAPE["layers"], "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 4096, "vocab_size": v, "torch_dtype": "bfloat16"}))
    return tmp_path


@pytest.fixture
def model(team_setup, checkpoint):
    from panel.registry.services import model_register

    return model_register(team=team_setup["team_a"], user=team_setup["alice"], source=str(checkpoint), name="small")


def host_with(engine, team, name="box"):
    """An online GPU worker host whose latest engine check found `engine`."""
    host = WorkerHost.objects.create(name=f"gpu@{name}", host=name, kind="gpu", queues=["gpu", f"gpu.{name}"],
                                     last_seen=timezone.now(), gpus=engine.get("cuda_devices", []))
    EngineCheck.objects.create(team=team, host=host, state="succeeded", finished_at=timezone.now(), result=engine)
    return host


def test_it_knows_the_same_schemes_as_the_engine():
    assert set(schemes.SCHEMES) == set(quant_schemes.SCHEMES)
    assert {key for key, scheme in schemes.SCHEMES.items() if scheme.calibrated} == set(quant_schemes.CALIBRATED)


@pytest.mark.parametrize("engine, scheme, answer, words", [
    (CPU_AVX512, "w8a8-int8", True, "int8 scaled-mm"),
    (CPU_AVX2, "w8a8-int8", True, "int8 scaled-mm"),
    ({**CPU_AVX2, "int8_exact": False, "int8_error": 0.097}, "w8a8-int8", True, "products saturate (no VNNI: 10%"),
    (CPU_AVX512, "w4a16-gptq", True, "cpu_gemm_wna16"),
    (CPU_AVX2, "w4a16-awq", False, "AVX-512"),
    (CPU_AVX512, "fp8-dynamic", True, "the engine check multiplied with it"),
    (CPU_AVX2, "fp8-dynamic", False, "cannot multiply FP8 weights"),
    (OLD_CHECK, "fp8-dynamic", None, "run Check engine again"),
    (H200, "fp8-dynamic", True, "compute capability 9.0"),
    (A100, "fp8-dynamic", False, "8.9 or higher"),
    (A100, "w4a16-awq", True, "CUDA"),
    ({}, "w8a8-int8", None, "Check engine"),
])
def test_it_says_whether_a_host_serves_each_scheme(engine, scheme, answer, words):
    verdict = schemes.host_serves(scheme, engine)
    assert verdict.answer is answer and words in verdict.reason


def test_fp8_kept_layers_follow_the_hosts_fp8_check():
    assert schemes.host_serves("mixed", CPU_AVX512, keep_as="bf16").answer is True
    assert schemes.host_serves("mixed", CPU_AVX512, keep_as="fp8").answer is True
    assert schemes.host_serves("mixed", CPU_AVX2, keep_as="fp8").answer is False


def test_it_expects_sizes_from_the_checkpoints_own_tensors(model):
    h, i, kv, v, layers = (SHAPE[key] for key in ("hidden", "intermediate", "kv", "vocab", "layers"))
    linear = layers * (2 * h * h + 2 * kv * h + 3 * h * i)
    other = 2 * v * h * 2 + h * 2 + layers * h * 2  # embeddings and lm_head (bf16), norms
    w8a8 = schemes.expected_size(model, "w8a8-int8")
    assert w8a8["quantized_bytes_before"] == linear * 2 and w8a8["other_bytes"] == other
    assert w8a8["bytes"] == other + linear + sum(out * 4 for out in [h, kv, kv, h, i, i, h]) * layers
    w4 = schemes.expected_size(model, "w4a16-gptq", group_size=128)
    assert w4["bytes"] < w8a8["bytes"] < w8a8["before_bytes"]
    # The untouched embeddings keep the file far from "75 % smaller" for a model this shape.
    assert 0.2 < w4["reduction"] < 0.5 and w4["quantized_share"] < 0.5
    kept = [name for name in schemes.linear_layers(model) if ".layers.1." in name]
    mixed = schemes.expected_size(model, "mixed", kept=kept)
    assert w4["bytes"] < mixed["bytes"] < w8a8["before_bytes"]


def test_it_estimates_longer_for_calibration_and_bigger_models(model):
    fp8 = schemes.expected_seconds(model, "fp8-dynamic", samples=32, tokens=256, device="cpu")
    gptq = schemes.expected_seconds(model, "w4a16-gptq", samples=32, tokens=256, device="cpu")
    more = schemes.expected_seconds(model, "w4a16-gptq", samples=128, tokens=512, device="cpu")
    assert fp8 < gptq < more
    assert schemes.calibration_default({"gpus": []}) == (32, 256)
    assert schemes.calibration_default({"gpus": [{"name": "H200"}]}) == (128, 512)


PARENT_ARGMAX = tuple(range(20))
PARENT_GREEDY = ((1, 2), (3, 4), (5, 6), (7, 8))


def evaluation(model, *, perplexity, json_right=12, tasks_right=12, argmax=PARENT_ARGMAX, greedy=PARENT_GREEDY,
               size=1000, answers=("Tokyo",) * 26):
    kinds = {"json": [json_right, 12], "word": [min(tasks_right, 6), 6], "copy": [max(0, tasks_right - 6), 8]}
    return ModelEvaluation.objects.create(
        model=model, perplexity=perplexity, tokens_scored=len(argmax), json_valid=json_right, json_total=12,
        size_bytes=size, details={"argmax": list(argmax), "greedy": [list(g) for g in greedy],
                                  "tasks": {"answers": list(answers), "kinds": kinds},
                                  "speed": {"ttft_ms": 40.0, "tokens_per_second": 21.5}})


def differing(values, count):
    """`values` with the first `count` of them changed."""
    return tuple(value + 1000 if index < count else value for index, value in enumerate(values))


def child_of(model, name, scheme="w8a8-int8"):
    return RegisteredModel.objects.create(
        team=model.team, name=name, path=model.path + f"-{name}", parent=model, architecture=model.architecture,
        model_type="qwen2", parameter_count=1, linear_parameter_count=1, num_layers=2, num_attention_heads=4,
        num_kv_heads=2, hidden_size=256, head_dim=64, max_position_embeddings=4096, dtype="bfloat16", size_bytes=1,
        quantization={"method": "compressed-tensors", "bits": 8, "scheme": scheme})


def test_a_child_close_to_its_parent_in_every_column_is_safe_to_serve_in_words(model):
    parent = evaluation(model, perplexity=20.0)
    good = evaluation(child_of(model, "w8"), perplexity=20.4, argmax=differing(PARENT_ARGMAX, 1))

    fine = compare(good, parent)
    assert round(fine.perplexity_change, 1) == 2.0 and fine.token_agreement == 95.0 and fine.greedy_agreement == 100
    assert fine.json_drop == 0.0 and fine.task_drop == 0.0 and fine.same_answers == 100 and fine.flags == ()
    assert fine.verdict == "safe"
    assert fine.words == ("W8A8 INT8: perplexity +2.0%, keeps every JSON answer and 12 of 14 other task answers: "
                          "safe to serve.")
    assert quality_flags(good.model) == [] and quality_verdict(good.model).verdict == "safe"


def test_w8a8_measured_where_int8_products_saturate_says_the_processor_shares_the_loss(model):
    parent = evaluation(model, perplexity=20.0)
    child = evaluation(child_of(model, "w8"), perplexity=21.6, argmax=differing(PARENT_ARGMAX, 1))
    exact = compare(child, parent).words
    assert compare(child, parent).verdict == "check"  # perplexity +8%: a loss to explain
    assert "saturate" not in exact  # no probe recorded, as in reports from before it
    child.details["int8_error"] = 1e-7  # a VNNI or AMX processor
    child.save()
    assert compare(child, parent).words == exact
    child.details["int8_error"] = 0.097  # AVX2 alone
    child.save()
    words = compare(child, parent).words
    assert words.startswith(exact) and words.endswith(
        " Measured on a CPU whose int8 products saturate (no VNNI: 10% error in a test product): part of this loss "
        "is the processor's, and a GPU or a CPU with AVX512-VNNI or AMX loses less.")
    close = evaluation(child_of(model, "w8-close"), perplexity=20.2, argmax=differing(PARENT_ARGMAX, 1))
    close.details["int8_error"] = 0.097
    close.save()
    assert compare(close, parent).words.endswith("safe to serve.")  # no loss, no excuse
    awq = evaluation(child_of(model, "awq", scheme="w4a16"), perplexity=21.6)
    awq.details["int8_error"] = 0.097  # the probe ran, but the model multiplies no int8 activations
    awq.save()
    assert "saturate" not in compare(awq, parent).words


@pytest.mark.engine
def test_the_int8_probe_finds_exact_products_only_where_the_processor_has_int8_dot_products():
    """The engine's own check of vLLM's CPU W8A8 kernel: exact with VNNI or AMX, about 10% off on AVX2 alone (its
    u8×s8 instruction saturates int16 sums); whichever this processor is, the answer must follow its flags."""
    import subprocess

    from django.conf import settings

    from engine.engine_probe import cpu_flags

    code = "import torch; from engine.engine_probe import int8_product_error as e; print(e(torch))"
    out = subprocess.run([str(settings.ENGINE_PYTHON), "-c", code], capture_output=True, text=True, timeout=300,
                         check=True).stdout.strip().splitlines()[-1]
    error = float(out)
    flags = cpu_flags()
    if flags & {"avx512_vnni", "avx_vnni", "amx_int8"}:
        assert error < 1e-3, (error, sorted(flags))
    else:
        assert error > 0.01, (error, sorted(flags))


@pytest.mark.parametrize("changes, flag", [
    ({"perplexity": 21.4}, "perplexity up 7.0% (more than 5%)"),
    ({"json_right": 11}, "JSON answers down 8.3 points (more than 3)"),
    ({"tasks_right": 9}, "task answers down 21.4 points (more than 10)"),
    ({"argmax": differing(PARENT_ARGMAX, 4)}, "next-token agreement 80.0% (under 85%)"),
    # Today's perplexity and JSON can look fine while the greedy answers went elsewhere: that counts too.
    ({"greedy": ((0, 0),) * 4}, "same greedy answer in 0% of prompts (under 25%)"),
])
def test_every_column_counts_toward_the_verdict(model, changes, flag):
    parent = evaluation(model, perplexity=20.0)
    child = evaluation(child_of(model, "w8"), **{"perplexity": 20.2, **changes})
    judged = compare(child, parent)
    assert judged.flags == (flag,) and judged.verdict == "check"
    assert judged.words == f"W8A8 INT8: {flag}: check its answers before serving it."


@pytest.mark.parametrize("changes", [{"perplexity": 26.0}, {"json_right": 10}, {"tasks_right": 5},
                                     {"argmax": differing(PARENT_ARGMAX, 10)}])
def test_three_times_a_limit_is_not_for_production(model, changes):
    parent = evaluation(model, perplexity=20.0)
    child = evaluation(child_of(model, "crude", "w4a16-rtn"), **{"perplexity": 20.2, **changes})
    judged = compare(child, parent)
    assert judged.verdict == "reject" and judged.words.endswith(": not for production.")
    assert judged.words.startswith(f"{child.model.quantization_label}: ")
    assert quality_flags(child.model) == list(judged.flags)


def test_it_reports_the_parent_and_every_sibling_side_by_side(client, team_setup, model):
    evaluation(model, perplexity=20.0, size=4000)
    evaluation(child_of(model, "small-w8a8"), perplexity=20.2, size=2000)
    evaluation(child_of(model, "small-w4", "w4a16-gptq"), perplexity=20.5, size=1200,
               answers=("Paris",) * 26)
    child_of(model, "small-fp8", "fp8-dynamic")  # not measured yet
    crude = child_of(model, "small-rtn", "w4a16-rtn")
    evaluation(crude, perplexity=30.0, json_right=6)

    report = quality_report(crude)
    assert [row["model"].name for row in report["rows"]] == ["small", "small-fp8", "small-rtn", "small-w4",
                                                              "small-w8a8"]
    assert report["subject"]["model"] == crude and report["rows"][1]["comparison"] is None
    assert report["recommended"]["model"].name == "small-w4"  # the smallest of those safe to serve
    assert report["rows"][3]["comparison"].same_answers == 0

    client.force_login(team_setup["alice"])
    page = client.get(reverse("model_detail", args=[crude.pk])).content.decode()
    assert "Not for production." in page and "perplexity up 50.0%" in page and "JSON answers down 50.0 points" in page
    assert "not measured yet" in page and page.count(">safe to serve<") == 2 and ">not for production<" in page
    assert "Recommended:" in page and "21.5 tokens/s" in page and "TTFT 40 ms" in page
    assert "In memory" not in page


def test_it_names_the_scheme_that_keeps_most_of_the_parent_at_each_size_even_when_none_passes(client, team_setup,
                                                                                               model):
    # The H200 measurement of SmolLM2-135M: at 4 bits AWQ +19.4 %, GPTQ +37.1 %, round-to-nearest +40.1 %.
    evaluation(model, perplexity=10.0, size=4000)
    awq = child_of(model, "smol-awq", "w4a16-awq")
    evaluation(awq, perplexity=11.94, size=1200)
    evaluation(child_of(model, "smol-gptq", "w4a16-gptq"), perplexity=13.71, size=1190)
    rtn = child_of(model, "smol-rtn", "w4a16-rtn")
    RegisteredModel.objects.filter(pk=rtn.pk).update(quantization={**rtn.quantization, "bits": 4})
    evaluation(rtn, perplexity=14.01, size=1190)
    w8a8 = child_of(model, "smol-w8a8")
    evaluation(w8a8, perplexity=10.36, size=2000)

    report = quality_report(awq)
    assert report["recommended"]["model"] == w8a8  # the one child safe to serve
    [four] = report["best"]  # one 8-bit child alone is no comparison
    assert four["bits"] == 4 and four["row"]["model"] == awq
    assert [row["model"].name for row in four["others"]] == ["smol-gptq", "smol-rtn"]
    assert [row.get("best_bits") for row in report["rows"]] == [None, 4, None, None, None]

    client.force_login(team_setup["alice"])
    page = client.get(reverse("model_detail", args=[w8a8.pk])).content.decode()
    assert ("Best at 4 bits:</strong> <a href=\"/models/%d/\">smol-awq</a> (W4A16 AWQ: perplexity +19.4%%), ahead of "
            "smol-gptq (W4A16 GPTQ: +37.1%%) and smol-rtn (W4A16 round-to-nearest: +40.1%%). None of them is safe to "
            "serve" % awq.pk) in page
    assert page.count("best 4-bit</span>") == 1

    # A second 8-bit child makes an 8-bit class; a safe one wins it over a larger perplexity drop that is flagged.
    fp8 = child_of(model, "smol-fp8", "fp8-dynamic")
    evaluation(fp8, perplexity=10.1, json_right=6, size=2000)
    eight, four = quality_report(awq)["best"]
    assert (eight["bits"], eight["row"]["model"], [row["model"] for row in eight["others"]]) == (8, w8a8, [fp8])
    assert four["row"]["model"] == awq


def test_it_refuses_a_report_against_another_teams_model_or_itself(team_setup, model):
    other = RegisteredModel.objects.create(
        team=team_setup["team_b"], name="theirs", path="/x", architecture="Qwen2ForCausalLM", model_type="qwen2",
        parameter_count=1, linear_parameter_count=1, num_layers=1, num_attention_heads=1, num_kv_heads=1,
        hidden_size=8, head_dim=8, max_position_embeddings=8, dtype="bfloat16", size_bytes=1)
    with pytest.raises(ValidationError, match="belong to this team"):
        evaluation_launch(team=model.team, user=None, model=model, baseline=other, enqueue=False)
    with pytest.raises(ValidationError, match="not with itself"):
        evaluation_launch(team=model.team, user=None, model=model, baseline=model, enqueue=False)
    assert EvaluationJob.objects.count() == 0


def test_it_measures_a_parent_once_for_all_its_children(team_setup, model):
    evaluation(model, perplexity=20.0)
    job = evaluation_launch(team=model.team, user=None, model=child_of(model, "w8"), enqueue=False)
    assert job.baseline == model and job.measured == [job.model.pk]


def test_it_refuses_to_evaluate_what_the_host_cannot_serve(team_setup, model):
    host = host_with(CPU_AVX2, model.team)
    with pytest.raises(ValidationError, match="cannot serve small-awq.*AVX-512"):
        evaluation_launch(team=model.team, user=None, model=child_of(model, "small-awq", "w4a16-awq"), host=host,
                          enqueue=False)
    assert EvaluationJob.objects.count() == 0


@pytest.mark.parametrize("content, message", [
    (b"", "empty"),
    (b'{"prompt": "hi"}\nnot json\n', "Line 2 is not JSON"),
    (b'{"text": "hi"}\n', "Line 1 needs \"prompt\""),
    (b'{"prompt": "hi", "expected": 3}\n', "\"expected\" must be text"),
    ("\n".join(['{"prompt": "x"}'] * 201).encode(), "more than 200 prompts"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_it_refuses_a_bad_prompt_file(content, message):
    with pytest.raises(ValidationError, match=message):
        prompt_file_check(content)


def test_it_accepts_prompts_and_chats_with_expected_answers():
    assert prompt_file_check(b'{"prompt": "2+2=", "expected": "4"}\n\n{"messages": [{"role": "user", '
                             b'"content": "JSON please"}], "json": true}\n') == 2


def test_the_form_refuses_a_scheme_no_online_host_serves(client, team_setup, model,
                                                         django_capture_on_commit_callbacks):
    host_with(CPU_AVX2, team_setup["team_a"])
    client.force_login(team_setup["alice"])
    form = client.get(reverse("quantization_create", args=[model.pk])).content.decode()
    assert 'value="w8a8-int8"' in form and "W4A16 kernel (cpu_gemm_wna16)" in form
    assert 'name="max_calib_samples" value="32"' in form and 'name="max_calib_seq_len" value="256"' in form
    data = {"scheme": "w4a16-gptq", "q_group_size": 128, "calibration": "builtin", "max_calib_samples": 32,
            "max_calib_seq_len": 256, "keep_as": "bf16", "version": "GEMM"}
    refused = client.post(reverse("quantization_create", args=[model.pk]), data)
    assert refused.status_code == 400 and "No GPU worker here can serve W4A16 GPTQ" in refused.content.decode()
    assert QuantizationJob.objects.count() == 0
    with django_capture_on_commit_callbacks(execute=False):
        accepted = client.post(reverse("quantization_create", args=[model.pk]), dict(data, scheme="w8a8-int8"))
    assert accepted.status_code == 302
    job = QuantizationJob.objects.get()
    assert (job.scheme, job.backend, job.max_calib_samples) == ("w8a8-int8", "llm-compressor", 32)


@pytest.mark.parametrize("changes, message", [
    ({"scheme": "mixed"}, "Name at least one layer"),
    ({"scheme": "mixed", "keep_patterns": "layers.9."}, "names no linear layer"),
    ({"scheme": "mixed", "keep_patterns": "proj"}, "keep every linear layer"),
    ({"scheme": "mixed", "keep_patterns": "re:(["}, "not a valid regular expression"),
    ({"scheme": "w8a8-int8", "backend": "autoawq"}, "runs on llm-compressor, not autoawq"),
    ({"scheme": "w4a16-awq", "backend": "autoawq", "q_group_size": 0}, "AutoAWQ needs a group size"),
    ({"scheme": "w4a16-gptq", "smoothquant": 0.5}, "SmoothQuant goes with W8A8 only"),
    ({"scheme": "w8a8-int8", "smoothquant": 2}, "less than or equal to 0.95"),
])
def test_the_form_refuses_settings_that_do_not_go_together(client, team_setup, model, changes, message):
    client.force_login(team_setup["alice"])
    data = {"scheme": "w8a8-int8", "q_group_size": 128, "calibration": "builtin", "max_calib_samples": 32,
            "max_calib_seq_len": 256, "keep_as": "bf16", "version": "GEMM", **changes}
    response = client.post(reverse("quantization_create", args=[model.pk]), data)
    assert response.status_code == 400 and message in response.content.decode()
    assert QuantizationJob.objects.count() == 0


def test_the_report_form_stores_nothing_for_a_bad_file(client, team_setup, model, settings):
    child = child_of(model, "w8")
    client.force_login(team_setup["alice"])
    stored = settings.DATA_DIR / "evaluation"  # this worker's earlier tests may have left files of their own there
    before = sorted(stored.rglob("*"))
    response = client.post(reverse("evaluation_create", args=[child.pk]),
                           {"prompt_file": SimpleUploadedFile("p.jsonl", b'{"nope": 1}\n')})
    assert response.status_code == 400 and "needs &quot;prompt&quot;" in response.content.decode()
    assert EvaluationJob.objects.count() == 0 and sorted(stored.rglob("*")) == before


def test_the_evaluation_inputs_were_never_trained_on_nor_calibrated_on():
    held_out = set(evaluation_text.HELD_OUT_MODULES)
    assert not held_out & set(builder.CORPUS_MODULES)
    assert not held_out & set(awq_calibration.BUILTIN_CORPUS_MODULES)
    assert len(evaluation_text.held_out_texts()) == len(held_out)
    train = {evaluation_text.json_turn(i, split="train")[1]["content"] for i in range(600)}
    evaluate = {evaluation_text.json_turn(i, split="eval")[1]["content"] for i in range(quality_tasks.JSON_TASKS)}
    assert not train & evaluate and all(json.loads(answer) for answer in evaluate)
    assert not set(evaluation_text.TRAIN_NAMES) & set(evaluation_text.EVAL_NAMES)


def test_serving_refuses_a_quantized_child_the_host_cannot_serve(model):
    from panel.serving.rules import check_profile

    host = {"kind": "cpu", "gpus": [], "memory_available_bytes": 8 << 30, "serves_awq": False, "engine": CPU_AVX2}
    profile = {"quantization": "compressed-tensors", "block_size": 32, "max_model_len": 1024,
               "max_num_batched_tokens": 1024}
    w8a8, gptq = child_of(model, "w8"), child_of(model, "g4", "w4a16-gptq")
    assert check_profile(profile, model=w8a8, host=host).ok
    refused = check_profile(profile, model=gptq, host=host).errors["quantization"][0]
    assert "cannot serve W4A16 GPTQ" in refused and "cpu_gemm_wna16" in refused
    crude = child_of(model, "two", "w4a16-rtn")
    crude.quantization["bits"] = 2
    assert "2-bit weights, which vLLM cannot load" in check_profile(profile, model=crude).errors["quantization"][0]


def test_the_job_command_line_is_all_text(model):
    """Every argument the worker passes to the engine is a string (a float SmoothQuant strength once was not)."""
    from panel.registry.services import quantization_argv, quantization_launch

    job = quantization_launch(team=model.team, user=None, source=model, scheme="w8a8-int8", smoothquant=0.5,
                              enqueue=False)
    argv = quantization_argv(job)
    assert all(isinstance(part, str) for part in argv) and argv[argv.index("--smoothquant") + 1] == "0.5"
    mixed = quantization_launch(team=model.team, user=None, source=model, scheme="mixed", keep_patterns=["layers.1."],
                                enqueue=False)
    argv = quantization_argv(mixed)
    assert all(isinstance(part, str) for part in argv) and ["--keep", "layers.1.", "--keep-as", "bf16"] == argv[-4:]
