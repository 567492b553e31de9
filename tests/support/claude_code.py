"""Claude Code's own CLI, run as a user runs it against the gateway (`make claude-code` installs the pinned npm
package under .node/)."""
import json
import os
import subprocess

from tests.support.environment import ROOT

CLI = ROOT / ".node" / "node_modules" / ".bin" / "claude"


def run_claude(gateway, raw, model, folder, prompt):
    """The CLI's JSON result (stdout), after it exited; its stderr on failure."""
    assert CLI.exists(), f"Claude Code's CLI is not installed at {CLI}: `make claude-code` installs it"
    home = folder / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": gateway.url,
           "ANTHROPIC_API_KEY": raw, "ANTHROPIC_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    completed = subprocess.run([str(CLI), "-p", prompt, "--output-format", "json", "--allowedTools", "Read"],
                               cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, (completed.stdout[-2000:], completed.stderr[-2000:])
    return json.loads(completed.stdout)
