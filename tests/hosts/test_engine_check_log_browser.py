"""In Chromium: an engine check's log as a person reads it. It was mostly AutoAWQ's deprecation banner; the page
leaves known third-party banners out and offers the full log as a download."""
import subprocess

import pytest
from django.conf import settings
from playwright.sync_api import expect

from panel.hosts.models import EngineCheck, WorkerHost
from tests.support.browser import screenshot, sign_in

pytestmark = pytest.mark.engine  # it runs ENGINE_PYTHON


def test_the_engine_check_log_leaves_the_autoawq_banner_out_and_the_full_log_downloads(page, live_server,
                                                                                        team_setup):
    # The banner exactly as AutoAWQ prints it on import in the engine venv.
    banner = subprocess.run([settings.ENGINE_PYTHON, "-c", "import awq"], capture_output=True, text=True, check=False,
                            timeout=300).stderr
    assert "AutoAWQ is officially deprecated" in banner
    log = "probing the engine venv\n" + banner + "torch 2.x imported\nvllm imported\n"
    host = WorkerHost.objects.create(name="gpu@probe", host="probe", kind="gpu", cpu_count=2)
    check = EngineCheck.objects.create(team=team_setup["team_a"], host=host, state="failed", log_tail=log,
                                       failure_kind="engine", failure_reason="vllm could not start")
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/workers/checks/{check.pk}/")
    shown = page.locator("details.log pre")
    expect(shown).to_contain_text("vllm imported")
    expect(shown).to_contain_text("AutoAWQ's deprecation notice left out")
    expect(shown).not_to_contain_text("officially deprecated")
    expect(shown).not_to_contain_text("linkedin.com")
    screenshot(page, "engine-check-log")
    with page.expect_download() as download:
        page.click("text=Download the full log")
    assert "AutoAWQ is officially deprecated" in download.value.path().read_text()
