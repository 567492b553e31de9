"""Binding an operator's environment variable to origins for one test."""


def bind_credential_env(monkeypatch, variable, *urls, teams=()):
    """Bind an environment variable to the origins of `urls` (and to `teams`' slugs) for one test, as the operator's
    TOKENWISE_CREDENTIAL_ENV_BINDINGS does."""
    from django.conf import settings

    from panel.env import CredentialBinding, url_origin

    binding = CredentialBinding(origins=frozenset(url_origin(url) for url in urls), teams=frozenset(teams))
    monkeypatch.setattr(settings, "CREDENTIAL_ENV_BINDINGS", {**settings.CREDENTIAL_ENV_BINDINGS, variable: binding})
