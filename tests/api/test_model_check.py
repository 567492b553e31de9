"""POST /api/v1/models/{id}/check: the model page's Re-check for scripts; GET /model-checks/{id} follows it."""
from panel.accounts.models import Role
from panel.registry.models import ModelCheckJob
from tests.support.api_helpers import call, owner_token, token_for  # noqa: F401 (owner_token: a fixture)
from tests.support.checkpoints import check_failed, parent, w8a8  # noqa: F401 (parent, w8a8: fixtures)


def test_it_queues_a_check_and_answers_where_to_follow_it(client, owner_token, parent):
    check_failed(parent)
    answer = call(client, "post", f"/models/{parent.pk}/check", owner_token)
    assert answer.status_code == 201, answer.content
    body = answer.json()
    job = ModelCheckJob.objects.get()
    assert (body["id"], body["model_id"], body["state"]) == (job.pk, parent.pk, "pending")
    followed = call(client, "get", f"/model-checks/{job.pk}", owner_token).json()
    assert followed["state"] == "pending" and followed["events"][0]["to_state"] == "pending"
    again = call(client, "post", f"/models/{parent.pk}/check", owner_token)
    assert again.status_code == 400 and "is being checked already" in again.json()["detail"]
    assert ModelCheckJob.objects.count() == 1


def test_it_refuses_a_model_the_check_cannot_judge(client, owner_token, w8a8):
    refused = call(client, "post", f"/models/{w8a8.pk}/check", owner_token)
    assert refused.status_code == 400 and "is quantized" in refused.json()["detail"]
    assert not ModelCheckJob.objects.exists()


def test_a_viewer_or_another_team_may_not(client, team_setup, parent):
    check_failed(parent)
    viewer = token_for(team_setup["vera"], team_setup["team_a"], role=Role.VIEWER)
    assert call(client, "post", f"/models/{parent.pk}/check", viewer).status_code == 403
    theirs = token_for(team_setup["bob"], team_setup["team_b"])
    assert call(client, "post", f"/models/{parent.pk}/check", theirs).status_code == 404
    assert not ModelCheckJob.objects.exists()
    job = ModelCheckJob.objects.create(team=parent.team, model=parent, queue="gpu")
    assert call(client, "get", f"/model-checks/{job.pk}", theirs).status_code == 404
    assert call(client, "get", f"/model-checks/{job.pk}", viewer).status_code == 200
