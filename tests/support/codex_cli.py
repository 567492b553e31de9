"""OpenAI's Codex CLI, run as a user runs it against the gateway (`make codex` installs the pinned npm package, a
native binary, under .node/): `codex exec --json` with a custom model provider at the panel's /v1 and a team key,
its home (config, sessions, logs) in the test's folder, so it reads nothing of the machine's and has no login."""
import json
import os
import subprocess

from tests.support.environment import ROOT

CLI = ROOT / ".node" / "node_modules" / ".bin" / "codex"
# Codex 0.171 speaks only the Responses API to a provider (`wire_api = "chat"` is refused at start).
CONFIG = """model = "{model}"
model_provider = "tokenwise"
check_for_update_on_startup = false

[model_providers.tokenwise]
name = "Tokenwise"
base_url = "{base_url}/v1"
env_key = "TOKENWISE_KEY"
wire_api = "responses"

[analytics]
enabled = false
"""


def run_codex(gateway, raw, model, folder, prompt):
    """The CLI's JSON events (stdout, one per line), after it exited; its output on failure. The only command it
    runs is the one the fake upstream asks for, so it runs without Codex's sandbox (bubblewrap needs user
    namespaces, which a container may not give)."""
    assert CLI.exists(), f"Codex's CLI is not installed at {CLI}: `make codex` installs it"
    home = folder / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(CONFIG.format(model=model, base_url=gateway.url))
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home), "TOKENWISE_KEY": raw}
    completed = subprocess.run([str(CLI), "exec", "--json", "--skip-git-repo-check", "--sandbox",
                                "danger-full-access", prompt], cwd=folder, env=env, capture_output=True, text=True,
                               timeout=120, stdin=subprocess.DEVNULL)
    assert completed.returncode == 0, (completed.stdout[-2000:], completed.stderr[-2000:])
    return [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
