"""The provider statement import in a browser: the upload is checked as a whole, a worker reads the file, and the
import's page follows it to its end; a bad cell is named by its line and its column."""
from playwright.sync_api import expect

from panel.channels.models import Channel
from panel.dashboards.models import StatementImport
from panel.dashboards.statements import statement_import_run
from tests.support.browser import screenshot, sign_in


def test_an_import_with_a_bad_cell_fails_naming_its_line_and_column(page, live_server, team_setup, tmp_path):
    team = team_setup["team_a"]
    Channel.objects.create(team=team, name="taotoken", kind="remote", base_url="https://api.example.com/v1",
                           model_id="gpt-4o-mini")
    export = tmp_path / "usage.csv"
    export.write_text("date,input_tokens,output_tokens,cost_usd\n2026-11-20,900,100,0.80\n2026-11-21,10,5,1e200000\n")
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/dashboards/statements/")
    page.select_option("#id_channel", label="taotoken")
    page.set_input_files("#id_file", str(export))
    page.click("button:has-text('Compare')")
    job = StatementImport.objects.get()
    statement_import_run(job.pk, "worker@test")  # what the default queue's worker runs
    body = page.locator("main")
    expect(body).to_contain_text("line 3", timeout=20000)
    expect(body).to_contain_text("cost_usd")
    screenshot(page, "statement-import-failed")
    page.goto(f"{live_server.url}/members/")
    expect(page.locator("#gpu-quota")).to_be_visible()
    screenshot(page, "members-gpu-quota")
