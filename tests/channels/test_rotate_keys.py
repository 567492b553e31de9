"""Key rotation from the terminal: every stored credential moves to the new first key; one that no configured
key opens is reported and its channel marked misconfigured."""
import os
import subprocess
import sys

from cryptography.fernet import Fernet

from panel.channels.models import Channel
from panel.core import crypto
from tests.support.environment import ROOT, panel_env


def test_it_re_encrypts_every_stored_key_under_the_first_key(transactional_db, team_setup):
    from django.db import connection

    old = os.environ["TOKENWISE_ENCRYPTION_KEYS"]
    good = Channel.objects.create(team=team_setup["team_a"], name="cloud", base_url="https://x.example/v1",
                                  model_id="m", credential_kind="stored",
                                  credential_ciphertext=crypto.encrypt("sk-abcd1234"), credential_last4="1234")
    lost = Channel.objects.create(team=team_setup["team_a"], name="lost", base_url="https://y.example/v1",
                                  model_id="m", credential_kind="stored", credential_last4="9999",
                                  credential_ciphertext=Fernet(Fernet.generate_key()).encrypt(b"sk-9999").decode())
    new = Fernet.generate_key().decode()
    env = panel_env(DATABASE_URL=f"sqlite:///{connection.settings_dict['NAME']}",
                    TOKENWISE_ENCRYPTION_KEYS=f"{new},{old}")
    result = subprocess.run([sys.executable, "manage.py", "rotate_encryption_keys"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "re-encrypted 1 credential(s)" in result.stdout
    assert "lost" in result.stderr and "sk-" not in result.stderr + result.stdout
    good.refresh_from_db()
    lost.refresh_from_db()
    assert Fernet(new.encode()).decrypt(good.credential_ciphertext.encode()) == b"sk-abcd1234"
    assert lost.misconfigured and not good.misconfigured
