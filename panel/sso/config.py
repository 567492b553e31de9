"""The single sign-on settings, from TOKENWISE_OIDC_*: panel/settings.py calls `oidc_settings` once. Off unless
TOKENWISE_OIDC_CLIENT_ID is set; when it is, every other variable sign-in needs is checked here and a missing or bad
one stops start-up with a line naming it. The OIDC_* names are mozilla-django-oidc's own settings."""
from urllib.parse import urlsplit

from panel.env import EnvError, envint, envstr, url_origin
from panel.sso.mapping import group_map_parse

SIGN_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512")
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
OFF = {"SSO_ENABLED": False, "SSO_NAME": ""}


def _required(name):
    value = envstr(name, "")
    if not value.strip():
        raise EnvError(f"{name} is not set (single sign-on is on because TOKENWISE_OIDC_CLIENT_ID is set)")
    return value.strip()


def _provider_url(name):
    """An address of the provider: https, or http on this machine's loopback only (the code and tokens cross it)."""
    url = _required(name)
    if url_origin(url) is None:
        raise EnvError(f"{name}={url!r} is not an http(s) URL (the provider's /.well-known/openid-configuration "
                       "lists it)")
    if urlsplit(url).scheme != "https" and urlsplit(url).hostname not in LOOPBACK:
        raise EnvError(f"{name}={url!r}: the identity provider is reached over https (http only on 127.0.0.1)")
    return url


def oidc_settings(backends):
    """The Django settings for single sign-on, `backends` (the other authentication backends) after the provider's."""
    client_id = envstr("TOKENWISE_OIDC_CLIENT_ID", "").strip()
    if not client_id:
        return dict(OFF)
    scopes = envstr("TOKENWISE_OIDC_SCOPES", "openid email profile")
    if "openid" not in scopes.split():
        raise EnvError(f"TOKENWISE_OIDC_SCOPES={scopes!r} must include openid")
    algorithm = envstr("TOKENWISE_OIDC_SIGN_ALGO", "RS256")
    if algorithm not in SIGN_ALGORITHMS:
        raise EnvError(f"TOKENWISE_OIDC_SIGN_ALGO={algorithm!r} is not one of {', '.join(SIGN_ALGORITHMS)}")
    return {
        "SSO_ENABLED": True,
        "SSO_NAME": envstr("TOKENWISE_OIDC_NAME", "SSO").strip() or "SSO",  # "Sign in with <name>"
        "SSO_ISSUER": _provider_url("TOKENWISE_OIDC_ISSUER"),  # the id token's `iss`, compared as written
        "SSO_GROUPS_CLAIM": envstr("TOKENWISE_OIDC_GROUPS_CLAIM", "groups"),
        "SSO_GROUP_MAP": group_map_parse("TOKENWISE_OIDC_GROUPS", envstr("TOKENWISE_OIDC_GROUPS", "")),
        "AUTHENTICATION_BACKENDS": ["panel.sso.backends.ProviderBackend", *backends],
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": _required("TOKENWISE_OIDC_CLIENT_SECRET"),
        "OIDC_OP_AUTHORIZATION_ENDPOINT": _provider_url("TOKENWISE_OIDC_AUTHORIZATION_URL"),
        "OIDC_OP_TOKEN_ENDPOINT": _provider_url("TOKENWISE_OIDC_TOKEN_URL"),
        "OIDC_OP_USER_ENDPOINT": _provider_url("TOKENWISE_OIDC_USERINFO_URL"),
        "OIDC_OP_JWKS_ENDPOINT": _provider_url("TOKENWISE_OIDC_JWKS_URL"),
        "OIDC_RP_SIGN_ALGO": algorithm,
        "OIDC_RP_SCOPES": scopes,
        "OIDC_USE_PKCE": True,
        "OIDC_TOKEN_USE_BASIC_AUTH": True,  # client_secret_basic: what a provider accepts when told nothing else
        "OIDC_TIMEOUT": envint("TOKENWISE_OIDC_TIMEOUT_SECONDS", 10, minimum=1, maximum=120),
        "OIDC_AUTHENTICATION_CALLBACK_URL": "sso_callback",
    }
