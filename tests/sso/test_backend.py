"""The provider's backend beside Django's others: the id token's issuer and audience checked before the user info is
asked for, the password form untouched. The whole way through a real provider is tests/sso/test_browser.py."""
import pytest
from django.core.exceptions import SuspiciousOperation
from django.test import RequestFactory

from panel.sso.backends import ProviderBackend
from panel.sso.config import oidc_settings
from tests.sso.test_mapping import PROVIDER


@pytest.fixture
def backend(settings, monkeypatch):
    for name, value in PROVIDER.items():
        monkeypatch.setenv(name, value)
    for name, value in oidc_settings(settings.AUTHENTICATION_BACKENDS).items():
        setattr(settings, name, value)
    found = ProviderBackend()
    found.request = RequestFactory().get("/sso/callback/")
    return found


@pytest.mark.parametrize("payload, words", [
    ({"iss": "https://evil.example.com", "aud": "tokenwise", "sub": "ada"}, "is not TOKENWISE_OIDC_ISSUER"),
    ({"aud": "tokenwise", "sub": "ada"}, "is not TOKENWISE_OIDC_ISSUER"),
    ({"iss": "https://id.example.com", "aud": "another-app", "sub": "ada"}, "issued for another client"),
    ({"iss": "https://id.example.com", "aud": ["another-app"], "sub": "ada"}, "issued for another client"),
])
def test_it_refuses_an_id_token_from_another_issuer_or_for_another_client(backend, payload, words):
    with pytest.raises(SuspiciousOperation) as refused:
        backend.get_or_create_user("access-token", "id-token", payload)  # before any call to the provider
    assert words in str(refused.value)


def test_it_leaves_the_password_form_to_the_other_backends(backend, team_setup, client):
    assert backend.authenticate(RequestFactory().post("/login/"), username="alice", password="pw-alice-123") is None
    response = client.post("/login/", {"username": "alice", "password": "pw-alice-123"})
    assert response.status_code == 302 and response["Location"] == "/"


def test_it_answers_404_for_the_way_through_the_provider_while_off(client, db):
    for path in ("/sso/sign-in/", "/sso/callback/?code=x&state=y"):
        assert client.get(path).status_code == 404
    assert "Sign in with" not in client.get("/login/").content.decode()
