"""POST /api/v1/profiles/from-model/{id}: the model page's "Serve this model" for scripts, with the same defaults;
refusals write nothing."""

from panel.accounts.models import Role
from panel.registry.models import ModelState, RegisteredModel
from panel.serving.models import ServingProfile
from tests.support.api_helpers import call, owner_token, token_for  # noqa: F401 (owner_token: a fixture)
from tests.support.checkpoints import AUTOAWQ_W4, child_register, parent, parent_register, w8a8  # noqa: F401 (fixtures)


def from_model(client, model_id, token, body=None):
    """The call as a script makes it: JSON, or no body at all."""
    if body is None:
        return call(client, "post", f"/profiles/from-model/{model_id}", token, content_type="application/json")
    return call(client, "post", f"/profiles/from-model/{model_id}", token, body)


def test_it_creates_the_profile_an_llm_compressor_child_needs(client, team_setup, owner_token, w8a8):
    answer = from_model(client, w8a8.pk, owner_token)
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["model_id"] == w8a8.pk and body["errors"] == {}
    assert {key: body["values"][key] for key in ("name", "served_model_name", "dtype", "quantization",
                                                 "quantization_bits", "max_model_len")} == {
        "name": "tiny-w8a8-int8", "served_model_name": "tiny-w8a8-int8", "dtype": "auto",
        "quantization": "compressed-tensors", "quantization_bits": 8, "max_model_len": 4096}
    assert "--quantization" not in body["command"]  # vLLM reads the method from the checkpoint
    profile = ServingProfile.objects.get()
    assert (profile.pk, profile.team, profile.created_by) == (body["id"], team_setup["team_a"], team_setup["alice"])


def test_it_names_the_profile_as_asked_and_serves_an_awq_child_and_an_unquantized_model(client, owner_token, parent,
                                                                                       tmp_path):
    awq = child_register(parent, tmp_path / "awq", quantization_config=AUTOAWQ_W4, backend="autoawq",
                         scheme="w4a16-awq", name="tiny-awq")
    named = from_model(client, awq.pk, owner_token, {"name": "awq-cpu"}).json()
    assert (named["values"]["name"], named["values"]["quantization"], named["values"]["quantization_bits"]) == (
        "awq-cpu", "awq", 4)
    plain = from_model(client, parent.pk, owner_token, {}).json()
    assert (plain["values"]["quantization"], plain["values"]["quantization_bits"]) == ("none", None)
    assert ServingProfile.objects.count() == 2


def test_it_refuses_another_teams_model_a_model_not_ready_or_a_taken_name_and_writes_nothing(
        client, team_setup, owner_token, w8a8, tmp_path):
    theirs = parent_register(team_setup["team_b"], tmp_path / "theirs", name="theirs")
    other_team = from_model(client, theirs.pk, owner_token)
    assert other_team.status_code == 404 and other_team.json()["detail"] == "Not found in your team."

    RegisteredModel.objects.filter(pk=w8a8.pk).update(state=ModelState.BROKEN)
    broken = from_model(client, w8a8.pk, owner_token)
    assert broken.status_code == 400 and "failed its check as a model" in broken.json()["detail"]
    assert not ServingProfile.objects.exists()

    RegisteredModel.objects.filter(pk=w8a8.pk).update(state=ModelState.READY)
    assert from_model(client, w8a8.pk, owner_token).status_code == 201
    taken = from_model(client, w8a8.pk, owner_token)
    assert taken.status_code == 400
    assert taken.json()["errors"]["name"] == ["This team already has a profile named 'tiny-w8a8-int8'."]
    assert ServingProfile.objects.count() == 1


def test_a_viewer_may_not_create_one(client, team_setup, w8a8):
    viewer = token_for(team_setup["vera"], team_setup["team_a"], role=Role.VIEWER)
    assert from_model(client, w8a8.pk, viewer).status_code == 403
    assert not ServingProfile.objects.exists()


def test_a_profile_for_an_llm_compressor_child_saves_on_the_first_post(client, owner_token, w8a8):
    """POST /profiles with the model alone took the form's quantization default, "none", and was refused."""
    answer = call(client, "post", "/profiles", owner_token, {"name": "w8a8", "model": w8a8.pk})
    assert answer.status_code == 201, answer.content
    assert (answer.json()["values"]["quantization"], answer.json()["values"]["quantization_bits"]) == (
        "compressed-tensors", 8)
