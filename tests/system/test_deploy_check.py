"""The production settings pass Django's deployment checklist (`manage.py check --deploy`) with no warning."""
import secrets
import subprocess
import sys

from tests.support.environment import ROOT, panel_env


def test_it_passes_check_deploy_with_the_production_settings(tmp_path):
    env = panel_env(SECRET_KEY=secrets.token_urlsafe(50), DEBUG="0", TOKENWISE_HTTPS="1",
                    ALLOWED_HOSTS="tokenwise.example.com", TOKENWISE_DATA_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_it_names_what_is_insecure_without_https(tmp_path):
    env = panel_env(SECRET_KEY=secrets.token_urlsafe(50), DEBUG="0", TOKENWISE_HTTPS="0",
                    TOKENWISE_DATA_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "SESSION_COOKIE_SECURE" in result.stderr + result.stdout  # the reason TOKENWISE_HTTPS exists
