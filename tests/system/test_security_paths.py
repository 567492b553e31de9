"""Attack tests: a model is registered only from the configured model roots (and the hub cache), never from another
team's folder, and the error says nothing about whether a path outside exists."""
import pytest
from django.core.exceptions import ValidationError

from panel.registry.demo_model import build_demo_model
from panel.registry.models import RegisteredModel
from panel.registry.services import model_register

pytestmark = pytest.mark.engine  # the `tiny` fixture builds the demo model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("roots") / "tiny"
    build_demo_model(path)
    return path


def refusal(team, source):
    with pytest.raises(ValidationError) as caught:
        model_register(team=team, user=None, source=str(source))
    return caught.value.messages[0]


def test_a_folder_outside_the_roots_is_refused_alike_whether_it_exists_or_not(team_setup, tiny, settings, tmp_path):
    settings.MODEL_ROOTS = [str(tmp_path / "models")]
    existing = refusal(team_setup["team_a"], tiny)
    missing = refusal(team_setup["team_a"], tiny.parent / "no-such-model")
    assert "outside the folders models are registered from" in existing
    assert existing.replace(str(tiny), "X") == missing.replace(str(tiny.parent / "no-such-model"), "X")
    assert refusal(team_setup["team_a"], "/proc/self").replace("/proc/self", "X") == existing.replace(str(tiny), "X")
    assert not RegisteredModel.objects.exists()


def test_a_symlink_out_of_the_roots_is_refused(team_setup, tiny, settings, tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    (root / "link").symlink_to(tiny)
    settings.MODEL_ROOTS = [str(root)]
    assert "outside the folders" in refusal(team_setup["team_a"], root / "link")


def test_another_teams_model_folder_reads_as_missing(team_setup, tiny, settings):
    settings.MODEL_ROOTS = [str(tiny.parent)]
    model_register(team=team_setup["team_b"], user=None, source=str(tiny), name="b-model")
    taken = refusal(team_setup["team_a"], tiny)
    assert taken == refusal(team_setup["team_a"], tiny.parent / "gone").replace(str(tiny.parent / "gone"),
                                                                                 str(tiny))
    assert not RegisteredModel.objects.filter(team=team_setup["team_a"]).exists()
    assert model_register(team=team_setup["team_b"], user=None, source=str(tiny), name="again").pk
