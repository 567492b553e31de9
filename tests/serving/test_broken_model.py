"""A model that failed its check as a model cannot be served: the profile form (page and config.toml import) and
the launch (the service every page, API call and ladder goes through) refuse it in words that say what is wrong
and what to do, and write nothing. The API's side is tests/api/test_broken_model.py."""
import html

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from panel.hosts.models import WorkerHost
from panel.registry.models import ModelState, RegisteredModel
from panel.serving.models import Deployment, ServingProfile
from panel.serving.services import deployment_launch, profile_export_file
from tests.support.checkpoints import SERVING_REFUSED, check_failed, parent  # noqa: F401 (parent: a fixture)


@pytest.fixture
def profile(team_setup, parent):
    """Saved while the model was ready."""
    return ServingProfile.objects.create(team=team_setup["team_a"], name="tiny-cpu", model=parent,
                                         served_model_name="tiny", max_model_len=2048, block_size=32,
                                         max_num_batched_tokens=2048)


@pytest.fixture
def host():
    """An online CPU worker with room for the tiny model."""
    return WorkerHost.objects.create(name="gpu@h", host="h", kind="gpu", queues=["gpu"], last_seen=timezone.now(),
                                     memory_available_bytes=16 * 2**30)


def test_the_profile_form_refuses_a_broken_model_and_saves_nothing(client, team_setup, parent):
    client.force_login(team_setup["alice"])
    values = {"name": "tiny-cpu", "model": parent.pk, "served_model_name": "tiny", "dtype": "auto",
              "quantization": "none", "max_model_len": 2048, "block_size": 32, "gpu_memory_utilization": 0.9,
              "swap_space": 0, "max_num_seqs": 8, "max_num_batched_tokens": 2048, "tensor_parallel_size": 1,
              "pipeline_parallel_size": 1}
    check_failed(parent)
    refused = client.post(reverse("profile_create"), values)
    assert refused.status_code == 400
    assert refused.context["form"].errors["model"] == [SERVING_REFUSED]
    assert not ServingProfile.objects.exists()
    RegisteredModel.objects.filter(pk=parent.pk).update(state=ModelState.READY)  # the same values, a ready model
    assert client.post(reverse("profile_create"), values).status_code == 302
    assert ServingProfile.objects.get().model == parent


def test_editing_a_profile_of_a_model_that_broke_since_is_refused(client, team_setup, profile):
    check_failed(profile.model)
    client.force_login(team_setup["alice"])
    form = client.get(reverse("profile_edit", args=[profile.pk])).context["form"]
    data = {name: ("on" if value is True else value) for name in form.fields
            if (value := form[name].value()) not in (False, None)}
    refused = client.post(reverse("profile_edit", args=[profile.pk]), dict(data, max_num_seqs=4))
    assert refused.status_code == 400 and refused.context["form"].errors["model"] == [SERVING_REFUSED]
    profile.refresh_from_db()
    assert profile.max_num_seqs != 4


def test_a_config_toml_import_of_a_broken_model_is_refused(client, team_setup, profile):
    _, _, text = profile_export_file(profile, "toml")
    check_failed(profile.model)
    client.force_login(team_setup["alice"])
    refused = client.post(reverse("profile_import"), {"name": "again", "config": text})
    assert refused.status_code == 400 and SERVING_REFUSED in refused.content.decode().replace("&#x27;", "'")
    assert list(ServingProfile.objects.values_list("name", flat=True)) == ["tiny-cpu"]


def test_the_launch_refuses_a_profile_whose_model_broke_after_it_was_saved(team_setup, profile, host):
    check_failed(profile.model)
    for chosen in (host, None):  # on a named worker, or wherever there is room: the model's words, not a host's
        with pytest.raises(ValidationError) as refused:
            deployment_launch(team=team_setup["team_a"], user=team_setup["alice"], profile=profile, host=chosen,
                              enqueue=False)
        assert refused.value.messages == [SERVING_REFUSED]
    WorkerHost.objects.all().delete()  # no worker online: still the model's words (a worker would not help)
    with pytest.raises(ValidationError, match="Re-check it"):
        deployment_launch(team=team_setup["team_a"], user=None, profile=profile, enqueue=False)
    assert not Deployment.objects.exists()


def test_the_same_profile_launches_once_the_model_is_ready_again(team_setup, profile, host):
    check_failed(profile.model)
    RegisteredModel.objects.filter(pk=profile.model.pk).update(state=ModelState.READY)
    profile.model.refresh_from_db()
    deployment = deployment_launch(team=team_setup["team_a"], user=None, profile=profile, host=host, enqueue=False)
    assert deployment.host == host and Deployment.objects.count() == 1


def test_the_launch_button_says_why_and_starts_nothing(client, team_setup, profile, host):
    check_failed(profile.model)
    client.force_login(team_setup["alice"])
    response = client.post(reverse("deployment_create", args=[profile.pk]), {"host": host.pk, "replicas": 1},
                           follow=True)
    assert response.redirect_chain[-1][0] == reverse("profile_detail", args=[profile.pk])
    assert [str(message) for message in response.context["messages"]] == [SERVING_REFUSED]
    assert not Deployment.objects.exists()


def test_the_profile_page_shows_why_instead_of_a_launch_button(client, team_setup, profile):
    client.force_login(team_setup["alice"])
    launch = reverse("deployment_create", args=[profile.pk])
    assert launch in client.get(reverse("profile_detail", args=[profile.pk])).content.decode()
    check_failed(profile.model)
    page = client.get(reverse("profile_detail", args=[profile.pk])).content.decode()
    assert launch not in page and ">Launch</button>" not in page
    assert html.escape(SERVING_REFUSED, quote=False) in page.replace("&#x27;", "'")
