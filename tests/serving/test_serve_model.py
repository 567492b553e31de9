"""Serve this model: a new profile that serves a registered model as its checkpoint needs (compressed-tensors for an
llm-compressor child, awq for an AutoAWQ child, none for an unquantized model), from the model page's button, and
the first save of such a profile."""
import html
import re

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from panel.registry.models import ModelState, RegisteredModel
from panel.serving.models import ServingProfile
from panel.serving.services import profile_defaults
from tests.support.checkpoints import (
    AUTOAWQ_W4,
    LLM_COMPRESSOR_W4A16,
    child_register,
    parent,  # noqa: F401 (a fixture)
    parent_register,
    w8a8,  # noqa: F401 (a fixture)
)


@pytest.fixture
def awq(parent, tmp_path):
    return child_register(parent, tmp_path / "tiny-awq-w4-g128", quantization_config=AUTOAWQ_W4, backend="autoawq",
                          scheme="w4a16-awq", name="tiny-awq-w4-g128")


def browser_data(form):
    """What a browser sends for a form it rendered, untouched: each field's shown value; an unticked box is left
    out, an empty field sent empty."""
    data = {}
    for name in form.fields:
        value = form[name].value()
        if value is True:
            data[name] = "on"
        elif value is not False:
            data[name] = "" if value is None else value
    return data


def test_it_serves_an_unquantized_model_as_it_is(parent):
    values = profile_defaults(model=parent)
    assert values == {"name": "tiny", "model": parent.pk, "served_model_name": "tiny", "dtype": "auto",
                      "quantization": "none", "quantization_bits": None, "max_model_len": 4096,
                      "tool_call_parser": ""}  # the demo model's chat template shows it no tools


def test_it_serves_an_llm_compressor_child_as_compressed_tensors_with_its_bits(parent, w8a8, tmp_path):
    assert w8a8.quantization["method"] == "compressed-tensors" and w8a8.parent == parent
    values = profile_defaults(model=w8a8)
    assert (values["quantization"], values["quantization_bits"]) == ("compressed-tensors", 8)
    assert (values["name"], values["served_model_name"], values["dtype"]) == ("tiny-w8a8-int8", "tiny-w8a8-int8",
                                                                             "auto")
    w4a16 = child_register(parent, tmp_path / "w4", quantization_config=LLM_COMPRESSOR_W4A16,
                           backend="llm-compressor", scheme="w4a16-gptq", name="tiny w4a16 gptq")
    values = profile_defaults(model=w4a16, name="mine")
    assert (values["quantization"], values["quantization_bits"]) == ("compressed-tensors", 4)
    assert (values["name"], values["served_model_name"]) == ("mine", "tiny-w4a16-gptq")  # nothing to quote


def test_it_serves_an_autoawq_child_as_awq_with_four_bits(awq):
    values = profile_defaults(model=awq)
    assert (values["quantization"], values["quantization_bits"], values["dtype"]) == ("awq", 4, "auto")


def test_it_refuses_a_model_vllm_cannot_serve(parent, tmp_path):
    two_bit = dict(LLM_COMPRESSOR_W4A16, config_groups={"group_0": {
        "targets": ["Linear"], "weights": dict(LLM_COMPRESSOR_W4A16["config_groups"]["group_0"]["weights"],
                                               num_bits=2), "input_activations": None}})
    crude = child_register(parent, tmp_path / "w2", quantization_config=two_bit, backend="llm-compressor",
                           scheme="w4a16-rtn", name="tiny-w2a16-rtn")
    with pytest.raises(ValidationError, match="2-bit weights: vLLM serves 4- and 8-bit"):
        profile_defaults(model=crude)
    RegisteredModel.objects.filter(pk=parent.pk).update(state=ModelState.BROKEN)
    parent.refresh_from_db()
    with pytest.raises(ValidationError, match="failed its check as a model"):
        profile_defaults(model=parent)


def test_the_first_save_of_a_profile_for_an_llm_compressor_child_succeeds(client, team_setup, parent, w8a8):
    """As a user fills the empty form: pick the child and save. The quantization select still showed its default,
    "none", which the rules refuse for a quantized checkpoint: the first save failed with "Set quantization to
    compressed-tensors". It now takes the checkpoint's own, as vLLM does."""
    client.force_login(team_setup["alice"])
    form = client.get(reverse("profile_create")).context["form"]
    assert form["quantization"].value() == "none"  # two models: none is preselected, so neither is its method
    response = client.post(reverse("profile_create"), dict(browser_data(form), name="w8a8", model=w8a8.pk),
                           follow=True)
    assert response.redirect_chain, response.context["form"].errors
    profile = ServingProfile.objects.get()
    assert (profile.model, profile.quantization, profile.quantization_bits) == (w8a8, "compressed-tensors", 8)
    assert "Quantization set to compressed-tensors" in response.content.decode()
    # Picking compressed-tensors by hand, bits left empty, saves too, with the checkpoint's bits.
    response = client.post(reverse("profile_create"), dict(browser_data(form), name="by-hand", model=w8a8.pk,
                                                           quantization="compressed-tensors"))
    assert response.status_code == 302 and ServingProfile.objects.get(name="by-hand").quantization_bits == 8
    # A method the checkpoint does not hold is still refused, and nothing is saved.
    refused = client.post(reverse("profile_create"), dict(browser_data(form), name="wrong", model=w8a8.pk,
                                                          quantization="awq", quantization_bits=4))
    assert refused.status_code == 400
    assert 'set quantization to "compressed-tensors"' in html.unescape(refused.content.decode())
    assert not ServingProfile.objects.filter(name="wrong").exists()


def test_an_awq_child_picked_by_hand_without_bits_saves_on_the_first_try(client, team_setup, parent, awq):
    """AWQ needs its bits ("AWQ uses 4-bit weights, got empty"): a user who picked awq and left bits empty was
    refused once."""
    client.force_login(team_setup["alice"])
    form = client.get(reverse("profile_create")).context["form"]
    response = client.post(reverse("profile_create"), dict(browser_data(form), name="awq", model=awq.pk,
                                                           quantization="awq"))
    assert response.status_code == 302, response.context["form"].errors
    assert ServingProfile.objects.values_list("quantization", "quantization_bits").get() == ("awq", 4)


def test_the_only_model_preselected_brings_its_quantization(client, team_setup, tmp_path):
    parent = parent_register(team_setup["team_b"], tmp_path / "b")
    awq = child_register(parent, tmp_path / "b-awq", quantization_config=AUTOAWQ_W4, backend="autoawq",
                         scheme="w4a16-awq", name="b-awq")
    RegisteredModel.objects.filter(pk=parent.pk).delete()
    client.force_login(team_setup["bob"])
    form = client.get(reverse("profile_create")).context["form"]
    assert (form["model"].value(), form["quantization"].value(), form["quantization_bits"].value()) == (
        awq.pk, "awq", 4)


def test_the_model_page_button_opens_a_prefilled_form_and_one_save_creates_the_profile(client, team_setup, w8a8):
    client.force_login(team_setup["alice"])
    page = client.get(reverse("model_detail", args=[w8a8.pk])).content.decode()
    link = re.search(r'href="([^"]+)">Serve this model<', page)
    assert link and link.group(1) == reverse("profile_create") + f"?model={w8a8.pk}"
    response = client.get(link.group(1))
    assert response.status_code == 200 and ServingProfile.objects.count() == 0  # nothing saved on the way
    text = response.content.decode()
    assert f'<option value="{w8a8.pk}" selected>' in text
    assert '<option value="compressed-tensors" selected>' in text and '<option value="8" selected>' in text
    assert 'name="served_model_name" value="tiny-w8a8-int8"' in text
    saved = client.post(link.group(1), browser_data(response.context["form"]))
    profile = ServingProfile.objects.get()
    assert saved.status_code == 302 and saved["Location"] == reverse("profile_detail", args=[profile.pk])
    assert (profile.name, profile.model, profile.quantization, profile.quantization_bits) == (
        "tiny-w8a8-int8", w8a8, "compressed-tensors", 8)
    assert profile.created_by == team_setup["alice"] and profile.team == team_setup["team_a"]
    again = client.get(link.group(1))  # served once already: the form offers the next free name
    assert again.context["form"]["name"].value() == "tiny-w8a8-int8-2"


def test_only_roles_that_edit_profiles_see_the_button_and_only_for_a_servable_model(client, team_setup, parent, awq):
    client.force_login(team_setup["vera"])  # a viewer
    assert "Serve this model" not in client.get(reverse("model_detail", args=[awq.pk])).content.decode()
    assert client.get(reverse("profile_create") + f"?model={awq.pk}").status_code == 403
    client.force_login(team_setup["alice"])
    assert "Serve this model" in client.get(reverse("model_detail", args=[parent.pk])).content.decode()
    RegisteredModel.objects.filter(pk=awq.pk).update(state=ModelState.BROKEN)
    page = client.get(reverse("model_detail", args=[awq.pk])).content.decode()
    assert "Serve this model" not in page and "Not servable" in page
    refused = client.get(reverse("profile_create") + f"?model={awq.pk}", follow=True)
    assert "failed its check as a model" in refused.content.decode() and ServingProfile.objects.count() == 0


def test_another_teams_model_or_a_bad_id_is_not_found(client, team_setup, tmp_path):
    theirs = parent_register(team_setup["team_b"], tmp_path / "theirs", name="theirs")
    client.force_login(team_setup["alice"])
    for query in (f"?model={theirs.pk}", "?model=x1", "?model="):
        assert client.get(reverse("profile_create") + query).status_code == 404, query
