"""The API refuses to serve a model that failed its check as a model, in the page's words, writing nothing: a new
profile, a change to one, a launch, and "Serve this model" (POST /profiles/from-model/{id}); a model's state is in
its answer."""
import pytest
from django.utils import timezone

from panel.hosts.models import WorkerHost
from panel.serving.models import Deployment, ServingProfile
from tests.support.api_helpers import call, owner_token  # noqa: F401 (owner_token: a fixture)
from tests.support.checkpoints import CHECK_PROBLEM, SERVING_REFUSED, check_failed, parent  # noqa: F401 (parent: a fixture)


@pytest.fixture
def profile(client, owner_token, parent):
    """Saved through the API while the model was ready."""
    answer = call(client, "post", "/profiles", owner_token, {"name": "tiny-cpu", "model": parent.pk,
                                                             "max_model_len": 2048, "block_size": 32,
                                                             "max_num_batched_tokens": 2048})
    assert answer.status_code == 201, answer.content
    return ServingProfile.objects.get(pk=answer.json()["id"])


def test_a_new_profile_for_a_broken_model_is_refused(client, owner_token, parent):
    check_failed(parent)
    answer = call(client, "post", "/profiles", owner_token, {"name": "tiny-cpu", "model": parent.pk,
                                                             "max_model_len": 2048, "block_size": 32})
    assert answer.status_code == 400 and answer.json()["errors"]["model"] == [SERVING_REFUSED]
    assert not ServingProfile.objects.exists()
    model = call(client, "get", f"/models/{parent.pk}", owner_token).json()
    assert model["state"] == "broken" and model["check_figures"]["problems"] == [CHECK_PROBLEM]


def test_a_profile_of_a_model_that_broke_since_says_so_and_cannot_change_or_launch(client, owner_token, profile):
    WorkerHost.objects.create(name="gpu@h", host="h", kind="gpu", queues=["gpu"], last_seen=timezone.now(),
                              memory_available_bytes=16 * 2**30)
    check_failed(profile.model)
    detail = call(client, "get", f"/profiles/{profile.pk}", owner_token).json()
    assert detail["errors"]["model"] == [SERVING_REFUSED]
    changed = call(client, "patch", f"/profiles/{profile.pk}", owner_token, {"max_num_seqs": 4})
    assert changed.status_code == 400 and changed.json()["errors"]["model"] == [SERVING_REFUSED]
    profile.refresh_from_db()
    assert profile.max_num_seqs != 4
    launched = call(client, "post", f"/profiles/{profile.pk}/deployments", owner_token, {})
    assert launched.status_code == 400 and launched.json()["detail"] == SERVING_REFUSED
    assert not Deployment.objects.exists()


def test_serve_this_model_refuses_a_broken_model(client, owner_token, parent):
    check_failed(parent)
    answer = call(client, "post", f"/profiles/from-model/{parent.pk}", owner_token, {})
    assert answer.status_code == 400 and answer.json()["detail"] == SERVING_REFUSED
    assert not ServingProfile.objects.exists()
