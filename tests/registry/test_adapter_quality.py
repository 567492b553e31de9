"""A LoRA adapter's quality report against its base, without the engine: who may ask for one (the team's adapter, on
its base or a quantized copy of it; refusals in words, nothing written), the engine's command (--lora, and
--lora-only where the base alone was measured before), the measurements stored apart from the base's own (a model
is measured once per inputs, alone and with each adapter), the adapter's row on the model page beside the base, the
button that queues it and the API, each launch audited with the adapter's name. The engine's own run is
tests/registry/test_adapter_quality_engine.py."""
import json
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from engine import evaluate
from panel.audit.models import AuditAction, AuditEvent
from panel.registry.adapters import VLLM_MAX_RANKS, adapter_delete, adapter_register
from panel.registry.models import EvaluationJob, ModelEvaluation, RegisteredModel
from panel.registry.quality import (
    BUILTIN,
    adapter_reports,
    evaluation_argv,
    evaluation_execute,
    evaluation_launch,
    evaluation_record,
    latest_evaluation,
    quality_report,
    unmeasured,
)
from panel.registry.services import model_register
from tests.registry.test_lora_adapters import QWEN, adapter_folder, base_checkpoint
from tests.support.api_helpers import bearer, token_for


@pytest.fixture
def tiny(team_setup, tmp_path):
    path = base_checkpoint(tmp_path / "tiny", QWEN)
    return model_register(team=team_setup["team_a"], user=None, source=str(path), name="tiny")


@pytest.fixture
def answers(team_setup, tiny, tmp_path):
    return adapter_register(team=team_setup["team_a"], user=None, base=tiny, served_name="tiny-answers",
                            source=str(adapter_folder(tmp_path / "answers", QWEN)))


def measurement(model, *, adapter=None, perplexity=20.0, inputs_key=BUILTIN, expected=None, argmax=tuple(range(20)),
                job=None):
    """A stored measurement as evaluation_record writes it; `expected`: (matched, total) of the prompt file."""
    details = {"argmax": list(argmax), "greedy": [[1, 2], [3, 4]],
               "tasks": {"answers": ["Tokyo"] * 4, "kinds": {"json": [12, 12], "word": [5, 6], "copy": [8, 8]}},
               "speed": {"ttft_ms": 40.0, "tokens_per_second": 21.5}}
    if expected is not None:
        details["file"] = {"total": expected[1], "expected_total": expected[1], "expected_matched": expected[0],
                           "json_total": 0, "json_valid": 0, "outputs": []}
    return ModelEvaluation.objects.create(model=model, adapter=adapter, inputs_key=inputs_key, perplexity=perplexity,
                                          tokens_scored=len(argmax), json_valid=12, json_total=12, size_bytes=1000,
                                          details=details, job=job)


def quantized_copy(model, name, bits=8):
    return RegisteredModel.objects.create(
        team=model.team, name=name, path=model.path + f"-{name}", parent=model, architecture=model.architecture,
        model_type="qwen2", parameter_count=1, linear_parameter_count=1, num_layers=2, num_attention_heads=4,
        num_kv_heads=2, hidden_size=256, head_dim=64, max_position_embeddings=4096, dtype="bfloat16", size_bytes=1,
        quantization={"method": "compressed-tensors", "bits": bits, "scheme": "w8a8-int8" if bits == 8 else
                      "w4a16-rtn"})


def refusal(**launch):
    with pytest.raises(ValidationError) as caught:
        evaluation_launch(user=None, enqueue=False, **launch)
    assert not EvaluationJob.objects.exists()
    return " ".join(caught.value.messages)


def test_it_refuses_an_adapter_that_is_not_the_teams_or_does_not_run_on_the_model_and_writes_nothing(
        team_setup, tiny, answers, tmp_path):
    team_a, team_b = team_setup["team_a"], team_setup["team_b"]
    other = model_register(team=team_a, user=None, source=str(base_checkpoint(tmp_path / "other", QWEN)),
                           name="other")
    theirs_base = model_register(team=team_b, user=None, source=str(base_checkpoint(tmp_path / "theirs", QWEN)),
                                 name="theirs")
    theirs = adapter_register(team=team_b, user=None, base=theirs_base,
                              source=str(adapter_folder(tmp_path / "theirs-answers", QWEN)))

    assert refusal(team=team_a, model=tiny, adapter=theirs) == "The adapter must belong to this team."
    assert refusal(team=team_a, model=other, adapter=answers) == (
        "The adapter answers was registered on tiny: it runs on that model or a quantized copy of it, not on other.")
    assert refusal(team=team_a, model=tiny, adapter=answers, baseline=other) == (
        "An adapter is compared with the model it runs on (tiny) alone: leave out the model to compare with.")
    assert refusal(team=team_a, model=quantized_copy(tiny, "tiny-w2", bits=2), adapter=answers) == (
        "vLLM cannot load tiny-w2 (2- or 3-bit weights): an adapter cannot be measured on it.")

    # On a quantized copy of its base the adapter runs (adapters_of allows it): the copy alone is the reference.
    job = evaluation_launch(team=team_a, user=None, model=quantized_copy(tiny, "tiny-w8"), adapter=answers,
                            enqueue=False)
    assert (job.model.name, job.adapter, job.baseline) == ("tiny-w8", answers, None)


def test_the_button_refuses_another_models_adapter_on_the_page_and_stores_no_file(client, team_setup, tiny, answers,
                                                                                tmp_path, settings):
    other = model_register(team=team_setup["team_a"], user=None, name="other",
                           source=str(base_checkpoint(tmp_path / "other", QWEN)))
    stored = Path(settings.DATA_DIR) / "evaluation"
    before = sorted(stored.rglob("*")) if stored.exists() else []
    client.force_login(team_setup["alice"])
    response = client.post(reverse("evaluation_create", args=[other.pk]), {
        "adapter": answers.pk, "prompt_file": SimpleUploadedFile("p.jsonl", b'{"prompt": "hi", "expected": "yo"}\n')})
    page = response.content.decode()
    assert response.status_code == 400 and "No such adapter runs on this model" in page
    assert page.index('id="adapters"') < page.index("No such adapter runs on this model") < page.index('id="quality"')
    # A refusal of the report itself (after the form) comes before the prompt file is stored, too.
    unique = json.dumps({"prompt": str(tmp_path), "expected": "yo"}).encode()  # a file never stored before
    response = client.post(reverse("evaluation_create", args=[quantized_copy(tiny, "tiny-w2", bits=2).pk]), {
        "adapter": answers.pk, "prompt_file": SimpleUploadedFile("p.jsonl", unique)})
    assert response.status_code == 400 and "an adapter cannot be measured on it" in response.content.decode()
    assert not EvaluationJob.objects.exists() and (sorted(stored.rglob("*")) if stored.exists() else []) == before


def test_the_engine_command_measures_the_base_with_the_adapter_and_the_base_alone_once(team_setup, tiny, answers):
    team = team_setup["team_a"]
    first = evaluation_launch(team=team, user=None, model=tiny, adapter=answers, enqueue=False)
    argv = evaluation_argv(first)
    assert argv[1:3] == ["-m", "engine.evaluate"] and first.measured == [tiny.pk]
    assert argv[3:] == ["--model", tiny.path, "--lora", answers.path]

    measurement(tiny)  # the base alone, measured meanwhile: only the adapter is left to measure
    second = evaluation_launch(team=team, user=None, model=tiny, adapter=answers, enqueue=False)
    assert second.measured == []
    assert evaluation_argv(second)[3:] == ["--model", tiny.path, "--lora", answers.path, "--lora-only"]

    measurement(tiny, adapter=answers)  # both measured on these inputs: the report reuses them, nothing runs
    assert evaluation_execute(job_id=second.pk, worker="test") is True
    second.refresh_from_db()
    assert second.state == "succeeded" and second.result == {"models": [], "reused": True}


def engine_result(path, *, perplexity, adapter=None):
    measured = {"path": path, "perplexity": perplexity, "tokens_scored": 3, "size_bytes": 10, "argmax": [1, 2, 3],
                "greedy": [[1]], "tasks": {"answers": ["a"], "kinds": {"json": [1, 2], "word": [1, 1]}},
                "speed": {"ttft_ms": 1.0, "tokens_per_second": 2.0}, "engine": "vllm"}
    return measured | ({"adapter": adapter} if adapter else {})


def test_the_measurements_are_stored_apart_and_never_taken_for_each_other(team_setup, tiny, answers, tmp_path):
    team = team_setup["team_a"]
    job = evaluation_launch(team=team, user=None, model=tiny, adapter=answers, enqueue=False)
    assert unmeasured([tiny], BUILTIN) == [tiny] and unmeasured([tiny], BUILTIN, answers) == [tiny]

    stranger = engine_result(tiny.path, perplexity=9.0, adapter=str(tmp_path / "another-adapter"))
    with pytest.raises(ValueError, match="which this job did not ask for"):
        evaluation_record(job, {"models": [engine_result(tiny.path, perplexity=10.0), stranger]})
    assert not ModelEvaluation.objects.exists()  # one transaction: nothing of a result that does not fit

    # The engine names folders by their absolute path; the adapter's as registered or resolved.
    recorded = evaluation_record(job, {"models": [
        engine_result(tiny.path, perplexity=10.0),
        engine_result(str(Path(tiny.path).resolve()), perplexity=12.5, adapter=answers.path)]})
    assert [row.get("adapter") for row in recorded["models"]] == [None, answers.path]
    alone, applied = ModelEvaluation.objects.get(adapter=None), ModelEvaluation.objects.get(adapter=answers)
    assert (alone.model, alone.perplexity, applied.model, applied.perplexity) == (tiny, 10.0, tiny, 12.5)
    assert latest_evaluation(tiny) == alone
    assert unmeasured([tiny], BUILTIN) == [] and unmeasured([tiny], BUILTIN, answers) == []

    # The other way round: a base measured only with its adapter still counts as unmeasured alone, and its
    # report shows no figures of the adapter's as the model's.
    ModelEvaluation.objects.filter(adapter=None).delete()
    assert unmeasured([tiny], BUILTIN) == [tiny] and unmeasured([tiny], BUILTIN, answers) == []
    assert latest_evaluation(tiny) is None and quality_report(tiny)["subject"]["comparison"] is None
    assert evaluation_launch(team=team, user=None, model=tiny, adapter=answers, enqueue=False).measured == [tiny.pk]


def test_the_model_page_shows_the_adapter_against_the_base_and_its_button_queues_a_report(
        client, team_setup, tiny, answers, django_capture_on_commit_callbacks):
    prompts = "file:0123456789abcdef"
    job = EvaluationJob.objects.create(team=tiny.team, model=tiny, adapter=answers, inputs_key=prompts,
                                       prompt_file_name="phrase.jsonl", state="succeeded", queue="gpu")
    measurement(tiny, perplexity=20.0, inputs_key=prompts, expected=(0, 2), job=job)
    measurement(tiny, adapter=answers, perplexity=23.0, inputs_key=prompts, expected=(2, 2), job=job,
                argmax=tuple(range(15)) + (99,) * 5)
    measurement(tiny, perplexity=50.0)  # the base on other inputs: not what the adapter is compared with

    [row] = adapter_reports(tiny, [answers])
    comparison = row["comparison"]
    assert comparison.baseline.perplexity == 20.0 and round(comparison.perplexity_change) == 15
    assert comparison.token_agreement == 75.0 and comparison.file_gain == 100.0
    assert comparison.verdict == "check" and comparison.words == (
        "answers: perplexity up 15.0% (more than 5%); next-token agreement 75.0% (under 85%): check its answers "
        "before serving it.")
    assert row["inputs"] == "phrase.jsonl and the built-in set"

    client.force_login(team_setup["alice"])
    page = client.get(reverse("model_detail", args=[tiny.pk])).content.decode()
    section = page[page.index('id="adapter-quality"'):page.index('id="quality"')]
    assert "answers<div class=\"muted small\">on phrase.jsonl and the built-in set" in section
    assert "23.00 <span class=\"muted small\">(+15.0%)</span><div class=\"muted small\">base 20.00" in section
    assert "75.0%" in section and "2 of 2 expected answers <span class=\"muted small\">(+100 pts)" in section
    assert "base 0 of 2" in section and ">check before serving<" in section
    assert section.count("Quality report against the base") == 1

    client.force_login(team_setup["vera"])  # a viewer reads the report and is offered no button
    page = client.get(reverse("model_detail", args=[tiny.pk])).content.decode()
    assert "base 0 of 2" in page and "Quality report against the base" not in page

    client.force_login(team_setup["alice"])
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post(reverse("evaluation_create", args=[tiny.pk]), {
            "adapter": answers.pk,
            "prompt_file": SimpleUploadedFile("phrase.jsonl", b'{"prompt": "Who?", "expected": "forty-two"}\n')})
    queued = EvaluationJob.objects.exclude(pk=job.pk).get()
    assert response.status_code == 302 and response.url == reverse("evaluation_job", args=[queued.pk])
    assert (queued.model, queued.adapter, queued.baseline, queued.prompt_file_name) == (tiny, answers, None,
                                                                                        "phrase.jsonl")
    assert queued.inputs_key.startswith("file:") and queued.measured == [tiny.pk]
    event = AuditEvent.objects.get(action=AuditAction.JOB_LAUNCHED)
    assert event.target == f"quality report #{queued.pk} of the adapter tiny-answers on tiny"
    detail = client.get(reverse("evaluation_job", args=[queued.pk])).content.decode()
    assert "The adapter answers on tiny, against tiny alone" in detail


def test_the_api_queues_an_adapters_report_and_refuses_another_teams(client, team_setup, tiny, answers, tmp_path,
                                                                    django_capture_on_commit_callbacks):
    owner = token_for(team_setup["alice"], team_setup["team_a"])
    theirs_base = model_register(team=team_setup["team_b"], user=None, name="theirs",
                                 source=str(base_checkpoint(tmp_path / "theirs", QWEN)))
    theirs = adapter_register(team=team_setup["team_b"], user=None, base=theirs_base,
                              source=str(adapter_folder(tmp_path / "theirs-answers", QWEN)))

    def launch(body):
        return client.post(f"/api/v1/models/{tiny.pk}/evaluate", data=json.dumps(body),
                           content_type="application/json", **bearer(owner))

    refused = launch({"adapter": theirs.pk})
    assert refused.status_code == 400 and "No such adapter runs on this model" in refused.json()["errors"]["adapter"][0]
    both = launch({"adapter": answers.pk, "baseline": theirs_base.pk})
    assert both.status_code == 400 and not EvaluationJob.objects.exists()
    with django_capture_on_commit_callbacks(execute=False):
        made = launch({"adapter": answers.pk, "prompt_text": '{"prompt": "Who?", "expected": "forty-two"}'})
    assert made.status_code == 201, made.content
    assert made.json()["adapter_id"] == answers.pk and made.json()["model_id"] == tiny.pk
    assert made.json()["baseline_id"] is None and made.json()["inputs_key"].startswith("file:")
    assert AuditEvent.objects.get(action=AuditAction.JOB_LAUNCHED).target == (
        f"quality report #{made.json()['id']} of the adapter tiny-answers on tiny")


def test_an_adapter_being_measured_is_not_removed(team_setup, tiny, answers):
    job = evaluation_launch(team=team_setup["team_a"], user=None, model=tiny, adapter=answers, enqueue=False)
    with pytest.raises(ValidationError, match=f"being measured \\(quality report #{job.pk}\\)"):
        adapter_delete(adapter=answers)
    EvaluationJob.objects.filter(pk=job.pk).update(state="succeeded")
    adapter_delete(adapter=answers)
    assert not EvaluationJob.objects.exists()  # its reports go with it; the base's own stay


def test_the_engine_rounds_an_adapters_rank_up_to_one_vllm_takes(tmp_path):
    assert evaluate.LORA_RANKS == VLLM_MAX_RANKS
    for rank, expected in ((8, 8), (9, 16), (300, 320)):
        (tmp_path / "adapter_config.json").write_text(json.dumps({"r": rank}))
        assert evaluate.lora_rank(tmp_path) == expected
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 600}))
    with pytest.raises(evaluate.EvaluationError, match="above vLLM's largest, 512"):
        evaluate.lora_rank(tmp_path)
