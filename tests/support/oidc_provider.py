"""A real OpenID Connect provider for the single sign-on tests: node's oidc-provider running
tests/support/oidc_provider.mjs on a free port, its users in a JSON file that `set_users` rewrites (read at every
sign-in). `make oidc-provider` installs the package under .node/."""
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import requests

from tests.support.environment import ROOT
from tests.support.waiting import wait_until

PACKAGE = ROOT / ".node" / "node_modules" / "oidc-provider"
SCRIPT = ROOT / "tests" / "support" / "oidc_provider.mjs"
CLIENT_ID = "tokenwise-panel"
CLIENT_SECRET = "sso-test-secret-0123456789abcdef"


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class OidcProvider:
    """`OidcProvider(folder, redirect_uri, users).start()`; `users` is {login: {"email", "groups", ...}}."""

    def __init__(self, folder, redirect_uri, users):
        self.folder = Path(folder)
        self.port = _free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.redirect_uri = redirect_uri
        self.users_file = self.folder / "users.json"
        self.log_path = self.folder / "oidc-provider.log"
        self.process = None
        self.set_users(users)

    def set_users(self, users):
        """Replace the provider's users; the next sign-in reads them."""
        self.users_file.write_text(json.dumps(users))

    def start(self, seconds=30):
        if not PACKAGE.is_dir():
            raise AssertionError(f"{PACKAGE} is missing: run `make oidc-provider`")
        env = dict(os.environ, PORT=str(self.port), ISSUER=self.issuer, CLIENT_ID=CLIENT_ID,
                   CLIENT_SECRET=CLIENT_SECRET, REDIRECT_URI=self.redirect_uri, USERS_FILE=str(self.users_file),
                   OIDC_PROVIDER_PACKAGE=str(PACKAGE))
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(["node", str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        wait_until(self._answers, seconds=seconds, interval=0.2, message=f"the OIDC provider ({self.log_path})")
        return self

    def _answers(self):
        if self.process.poll() is not None:
            raise AssertionError(f"the OIDC provider exited ({self.process.returncode}): {self.log_path.read_text()}")
        try:
            return requests.get(f"{self.issuer}/.well-known/openid-configuration", timeout=2).ok
        except requests.ConnectionError:
            return False

    def discovery(self):
        return requests.get(f"{self.issuer}/.well-known/openid-configuration", timeout=5).json()

    def panel_environment(self, groups):
        """The panel's TOKENWISE_OIDC_* variables for this provider, mapping groups as `groups` says."""
        found = self.discovery()
        return {
            "TOKENWISE_OIDC_NAME": "Acme ID",
            "TOKENWISE_OIDC_ISSUER": found["issuer"],
            "TOKENWISE_OIDC_AUTHORIZATION_URL": found["authorization_endpoint"],
            "TOKENWISE_OIDC_TOKEN_URL": found["token_endpoint"],
            "TOKENWISE_OIDC_USERINFO_URL": found["userinfo_endpoint"],
            "TOKENWISE_OIDC_JWKS_URL": found["jwks_uri"],
            "TOKENWISE_OIDC_CLIENT_ID": CLIENT_ID,
            "TOKENWISE_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "TOKENWISE_OIDC_SCOPES": "openid email profile groups",
            "TOKENWISE_OIDC_GROUPS": json.dumps(groups),
        }

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
