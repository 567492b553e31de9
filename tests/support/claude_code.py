"""Claude Code's own CLI, run as a user runs it against the gateway (`make claude-code` installs the pinned npm
package under .node/)."""
import json
import os
import subprocess

from tests.support.environment import ROOT

CLI = ROOT / ".node" / "node_modules" / ".bin" / "claude"
DEADLINE_SECONDS = 120
NOTABLE = ("[API", "[ERROR]", "[WARN]", "retry", "Retry", "fallback", "[engine]")  # its requests, errors and turns


def run_claude(gateway, raw, model, folder, prompt):
    """The CLI's JSON result (stdout), after it exited. It writes its debug log (its requests, retries, fallbacks)
    into its home under `folder`; a run that fails or outlasts DEADLINE_SECONDS fails with that log's tail."""
    assert CLI.exists(), f"Claude Code's CLI is not installed at {CLI}: `make claude-code` installs it"
    home = folder / "home"
    home.mkdir(exist_ok=True)
    log = home / "claude-debug.txt"
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": gateway.url,
           "ANTHROPIC_API_KEY": raw, "ANTHROPIC_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    command = [str(CLI), "-p", prompt, "--output-format", "json", "--allowedTools", "Read", "--debug-file", str(log)]
    try:
        completed = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                                   timeout=DEADLINE_SECONDS)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"Claude Code gave no answer in {DEADLINE_SECONDS} s; its stderr: {error.stderr!r}; "
                             f"its log's end:\n{_tail(log)}") from None
    assert completed.returncode == 0, (completed.stdout[-2000:], completed.stderr[-2000:], _tail(log))
    return json.loads(completed.stdout)


def _tail(log, lines=60):
    """The debug log's last lines about requests, errors and turns (not its config writes), or why there are none."""
    try:
        text = log.read_text(errors="replace")
    except OSError as error:
        return f"(no debug log: {error})"
    return "\n".join([line for line in text.splitlines() if any(mark in line for mark in NOTABLE)][-lines:])
