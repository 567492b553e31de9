"""Re-check: a model checked as a model again (the check after a GGUF import) from its page, as a job on a GPU
worker; the page shows it pending, then the new state when it ends. Only members who may register models start
one, only in their team; a model the check cannot judge is refused in words. The API's side is
tests/api/test_model_check.py; the check itself on a real model, tests/registry/test_gguf_import_engine.py."""
import pytest
from django.urls import reverse

from panel.audit.models import AuditAction, AuditEvent
from panel.jobs.models import JobState
from panel.jobs.services import job_claim, job_succeed
from panel.registry.model_check import model_check_launch, model_check_record
from panel.registry.models import ModelCheckJob, ModelState
from panel.serving.services import profile_defaults
from tests.support.checkpoints import check_failed, parent, w8a8  # noqa: F401 (parent, w8a8: fixtures)
from tests.support.waiting import wait_until

GOOD = {"perplexity": 10.46, "tokens_scored": 511, "question": "What is the capital of France? Answer in one word.",
        "answer": "The capital of France is Paris.", "answer_token_ids": [504, 3575, 282, 4649, 314, 7042, 30]}


def page(client, model):
    return client.get(reverse("model_detail", args=[model.pk])).content.decode()


def button(model):
    return f'action="{reverse("model_check_create", args=[model.pk])}"'


def said(response):
    return [str(message) for message in response.context["messages"]]


def test_it_queues_a_re_check_and_shows_it_pending(client, team_setup, parent, django_capture_on_commit_callbacks):
    check_failed(parent)
    client.force_login(team_setup["alice"])
    before = page(client, parent)
    assert "Broken:" in before and "Re-check it once its files are fixed, or import it again" in before
    assert button(parent) in before
    with django_capture_on_commit_callbacks(execute=False) as queued:
        response = client.post(reverse("model_check_create", args=[parent.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("model_detail", args=[parent.pk])
    assert len(queued) == 1  # one task, sent once the row is committed
    job = ModelCheckJob.objects.get()
    assert (job.model, job.state, job.queue, job.created_by) == (parent, JobState.PENDING, "gpu", team_setup["alice"])
    event = AuditEvent.objects.get(action=AuditAction.JOB_LAUNCHED)
    assert event.actor == team_setup["alice"] and f"check #{job.pk} of tiny" in event.target

    pending = page(client, parent)
    assert "state-pending" in pending and "it stays broken until the check ends" in pending
    assert 'data-live-reload >' in pending  # the region polls (no data-live-done) and reloads the page at the end
    assert button(parent) not in pending  # no second button
    live = client.get(reverse("model_check_live", args=[parent.pk])).content.decode()
    assert "state-pending" in live and "data-final" not in live
    again = client.post(reverse("model_check_create", args=[parent.pk]), follow=True)
    assert said(again) == ["tiny is being checked already: its page shows the outcome when that check ends."]
    assert ModelCheckJob.objects.count() == 1
    parent.refresh_from_db()
    assert parent.state == ModelState.BROKEN  # broken until the check says otherwise


def test_the_page_shows_the_new_outcome_when_the_check_ends(client, team_setup, parent):
    check_failed(parent)
    job = model_check_launch(team=team_setup["team_a"], user=team_setup["alice"], model=parent, enqueue=False)
    assert job_claim(job, worker="test")
    client.force_login(team_setup["alice"])
    assert "state-running" in client.get(reverse("model_check_live", args=[parent.pk])).content.decode()
    # What the task's runner does with engine/model_check.py's result (model_check_execute → run_job).
    job_succeed(job, result=model_check_record(job, dict(GOOD)))
    parent.refresh_from_db()
    assert parent.state == ModelState.READY and parent.check_figures["problems"] == []
    assert job.result["previous_state"] == "broken" and job.result["model_state"] == "ready"
    live = client.get(reverse("model_check_live", args=[parent.pk])).content.decode()
    assert "data-final" in live and "Broken" not in live and f"by re-check #{job.pk}" in live
    assert "10.46" in live and "The capital of France is Paris." in live
    after = page(client, parent)
    assert "Serve this model" in after and "Not servable" not in after and "data-live-done" in after
    assert profile_defaults(model=parent)["model"] == parent.pk  # servable again
    # And the other way: a model that stopped working is marked broken, with the problems in words.
    job = model_check_launch(team=team_setup["team_a"], user=None, model=parent, enqueue=False)
    job_claim(job, worker="test")
    job_succeed(job, result=model_check_record(job, dict(GOOD, perplexity=49152.0)))
    parent.refresh_from_db()
    assert parent.state == ModelState.BROKEN and "perplexity 49,152.0" in parent.check_figures["problems"][0]
    assert "Not servable" in page(client, parent)


def test_weights_missing_from_the_files_make_a_model_broken_whatever_else_it_scores(team_setup, parent):
    check_failed(parent)  # checked before (as an import is): the check may run on it again
    job = model_check_launch(team=team_setup["team_a"], user=None, model=parent, enqueue=False)
    job_claim(job, worker="test")
    job_succeed(job, result=model_check_record(job, dict(
        GOOD, missing_weights=37, weight_tensors=51, missing_examples=["model.layers.1.mlp.up_proj.weight"])))
    parent.refresh_from_db()
    assert parent.state == ModelState.BROKEN
    assert parent.check_figures["problems"] == [
        "37 of 51 weight tensors are missing from its files (e.g. model.layers.1.mlp.up_proj.weight): they were "
        "filled with random values"]


def test_only_a_member_who_may_register_models_re_checks_and_only_in_their_team(client, team_setup, parent):
    check_failed(parent)
    client.force_login(team_setup["bob"])  # another team's owner
    assert client.post(reverse("model_check_create", args=[parent.pk])).status_code == 404
    assert client.get(reverse("model_check_live", args=[parent.pk])).status_code == 404
    client.force_login(team_setup["vera"])  # a viewer of the model's team
    assert client.post(reverse("model_check_create", args=[parent.pk])).status_code == 403
    viewed = page(client, parent)
    assert "Broken:" in viewed and button(parent) not in viewed
    assert client.get(reverse("model_check_create", args=[parent.pk])).status_code == 405  # POST only
    assert not ModelCheckJob.objects.exists()


def test_it_refuses_a_model_the_check_cannot_judge(client, team_setup, parent, w8a8):
    client.force_login(team_setup["alice"])
    for model, words in ((w8a8, "tiny-w8a8-int8 is quantized: its check is its quality report"),
                         (parent, "the check's bounds are those of a working chat model of 100 M parameters")):
        assert button(model) not in page(client, model)
        refused = client.post(reverse("model_check_create", args=[model.pk]), follow=True)
        assert len(said(refused)) == 1 and words in said(refused)[0]
    assert not ModelCheckJob.objects.exists()
    # A model as large as the models the check is made for is checked even if it never was.
    type(parent).objects.filter(pk=parent.pk).update(parameter_count=134_515_008)
    assert button(parent) in page(client, parent)


@pytest.mark.engine  # a real gpu worker runs engine/model_check.py in the engine venv
def test_a_check_that_cannot_measure_the_model_fails_in_words_and_leaves_it_as_it_was(client, team_setup, parent,
                                                                                       start_worker):
    check_failed(parent)  # the hand-written checkpoint has no tokenizer: the check has nothing to measure
    start_worker("gpu")
    client.force_login(team_setup["alice"])
    assert client.post(reverse("model_check_create", args=[parent.pk])).status_code == 302
    job = ModelCheckJob.objects.get()
    wait_until(lambda: ModelCheckJob.objects.get(pk=job.pk).is_final, seconds=180,
               message="the check to end")
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.worker, job.log_tail
    assert job.failure_kind == "no_tokenizer" and "has no working tokenizer" in job.failure_reason, job.log_tail
    parent.refresh_from_db()
    assert parent.state == ModelState.BROKEN and parent.check_figures["answer"] == "!!!!"
    live = client.get(reverse("model_check_live", args=[parent.pk])).content.decode()
    assert "The last re-check did not run" in live and "tiny stays broken" in live and "data-final" in live
