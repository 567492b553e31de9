"""Long work cannot stall the periodic tasks: evaluation runs, benchmark runs, ladders and sweeps go to the `long`
queue, served by a worker of its own (the launcher starts it, compose runs it), never to `default`, where the
reaper, budgets, canaries, webhooks and the scaler run; and a team has at most TOKENWISE_TEAM_LONG_RUNS of them
queued or running at once, so one member cannot fill the long worker for every team."""
import json

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.test import override_settings
from django.urls import reverse

from panel import launcher
from panel.benchmarks.models import BenchmarkRun
from panel.benchmarks.services import benchmark_launch
from panel.evaluations.models import EvalRun
from panel.evaluations.runs import eval_run_launch
from panel.evaluations.services import eval_set_create
from panel.jobs.models import JobEvent, JobState
from tests.support.api_helpers import call, token_for
from tests.support.gateway import channel
from workers.celery import app
from workers.start import argv_for

LONG_TASKS = ("panel.evaluations.tasks.run_evaluation", "panel.benchmarks.tasks.run_benchmark",
              "panel.benchmarks.tasks.run_ladder", "panel.benchmarks.tasks.run_sweep")
CASE = {"id": "a", "prompt": "Say alpha.", "checks": [{"type": "contains", "text": "alpha"}]}


def routed(task):
    """The queue Celery sends `task` to when its sender names none (beat's periodic tasks)."""
    return app.amqp.router.route({}, task)["queue"].name


def served(kind):
    """The queues a `workers.start KIND` process listens on."""
    argv = argv_for(kind)
    return set(argv[argv.index("-Q") + 1].split(","))


@pytest.fixture
def eval_setup(team_setup):
    team = team_setup["team_a"]
    eval_set = eval_set_create(team=team, user=team_setup["alice"], name="smoke", text=json.dumps(CASE) + "\n")
    candidate = channel(team, "candidate", "http://127.0.0.1:9/v1", "m")
    return team_setup, eval_set, candidate


def test_an_evaluation_run_never_shares_a_queue_with_the_periodic_tasks(eval_setup, django_capture_on_commit_callbacks):
    team_setup, eval_set, candidate = eval_setup
    periodic = {routed(entry["task"]) for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert periodic == {"default"}
    run = eval_run_launch(team=team_setup["team_a"], user=team_setup["alice"], eval_set=eval_set,
                          candidate=f"channel:{candidate.pk}")
    assert run.queue not in periodic  # the queue job_enqueue sends it to
    for task in LONG_TASKS:
        assert routed(task) == "long", task
    assert served("default") == {"default"} and served("long") == {"long"}
    assert not served("gpu") & {"default", "long"}


def test_the_launcher_starts_a_worker_for_every_queue_work_is_sent_to():
    started = {kind for _, kind in launcher.CELERY_PROCESSES}
    assert {"default", "long", "gpu", "beat"} == started
    listened = set().union(*(served(kind) for kind in started - {"beat"}))
    assert {"default", "long", "gpu"} <= listened
    assert {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()} <= listened


@override_settings(TEAM_LONG_RUNS=2)
def test_a_team_at_its_limit_is_refused_in_words_and_another_team_is_not(eval_setup):
    team_setup, eval_set, candidate = eval_setup
    team, alice = team_setup["team_a"], team_setup["alice"]
    for _ in range(2):
        eval_run_launch(team=team, user=alice, eval_set=eval_set, candidate=f"channel:{candidate.pk}")
    runs, events = EvalRun.objects.count(), JobEvent.objects.count()
    refusal = "already has 2 evaluation or benchmark runs queued or running"
    with pytest.raises(ValidationError, match=refusal) as refused:
        eval_run_launch(team=team, user=alice, eval_set=eval_set, candidate=f"channel:{candidate.pk}")
    assert "wait for one to finish, or cancel one" in refused.value.messages[0]
    assert (EvalRun.objects.count(), JobEvent.objects.count()) == (runs, events)  # nothing written
    with pytest.raises(ValidationError, match="already has 2"):  # a benchmark counts against the same limit
        benchmark_launch(team=team, user=alice, target_kind="channel", target_id=candidate.pk, requests=1,
                         warmup_requests=0, enqueue=False)
    assert not BenchmarkRun.objects.exists()

    other = team_setup["team_b"]
    other_set = eval_set_create(team=other, user=team_setup["bob"], name="theirs", text=json.dumps(CASE) + "\n")
    theirs = channel(other, "theirs", "http://127.0.0.1:9/v1", "m")
    assert eval_run_launch(team=other, user=team_setup["bob"], eval_set=other_set,
                           candidate=f"channel:{theirs.pk}").state == JobState.PENDING

    EvalRun.objects.filter(team=team).update(state=JobState.SUCCEEDED)  # a run ends: the slot frees
    assert eval_run_launch(team=team, user=alice, eval_set=eval_set, candidate=f"channel:{candidate.pk}")


@override_settings(TEAM_LONG_RUNS=1)
def test_the_page_and_the_api_refuse_a_launch_past_the_limit(eval_setup, client):
    team_setup, eval_set, candidate = eval_setup
    team, alice = team_setup["team_a"], team_setup["alice"]
    eval_run_launch(team=team, user=alice, eval_set=eval_set, candidate=f"channel:{candidate.pk}")
    client.force_login(alice)
    page = client.post(reverse("eval_run_start", args=[eval_set.pk]), {"candidate": f"channel:{candidate.pk}"})
    assert page.status_code == 400 and "already has 1 evaluation or benchmark run queued" in page.content.decode()
    assert EvalRun.objects.count() == 1

    answer = call(client, "post", "/benchmarks", token_for(alice, team),
                  {"target": f"channel:{candidate.pk}", "workload": "builtin", "requests": 1, "warmup_requests": 0})
    assert answer.status_code == 429, answer.content
    assert "already has 1 evaluation or benchmark run queued" in answer.json()["detail"]
    assert not BenchmarkRun.objects.exists()

