"""The panel's URLs as the team/role gate sees them: the public ones, every gated pattern, every API operation."""
from django.urls import URLPattern, URLResolver, get_resolver

PUBLIC = {
    "login": "signing in",
    "logout": "signing out",
    "switch_team": "login_required; checks membership itself (404 for a team the user is not in)",
    "no_team": "login_required; for users in no team",
    "metrics": "Prometheus scrapes it without a session: bearer TOKENWISE_METRICS_TOKEN, or only on loopback",
    "account_setup": "an invited person's one-time set-password link (they have no password to sign in with yet)",
    "invitation_accept": "login_required; an invitation is found only among the signed-in account's own (the "
                         "invited account may be in no team yet)",
    "sso_sign_in": "signing in through the identity provider (404 while single sign-on is off)",
    "sso_callback": "the identity provider's answer to a sign-in (404 while single sign-on is off)",
    "sso_refused": "why a sign-in through the identity provider was refused (to someone not signed in)",
}


def gated_patterns():
    """(name, pattern, view) for every named URL of the panel outside the Django admin."""
    found = []

    def walk(patterns, prefix=""):
        for entry in patterns:
            if isinstance(entry, URLResolver):
                if entry.app_name == "admin" or entry.namespace == "api-v1":  # the API has its own matrix below
                    continue
                walk(entry.url_patterns, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern) and entry.name:
                found.append((entry.name, prefix + str(entry.pattern), entry.callback))

    walk(get_resolver().url_patterns)
    return found


def api_operations():
    """(method, path, token auth) for every operation the management API serves, as its OpenAPI schema lists them;
    the token auth is the personal-access-token half of the operation's gate (`.action`, `.role`, `.refusal`), read
    from the operation's decorator or its router's (None: the operation names no action)."""
    from ninja.constants import NOT_SET

    from panel.api.auth import AccessTokenAuth
    from panel.api.urls import ROUTERS, api

    gates = {}
    for router in ROUTERS:
        for path, path_view in router.path_operations.items():
            for operation in path_view.operations:
                callbacks = operation.auth_callbacks or (router.auth if router.auth is not NOT_SET else [])
                token_auth = next((each for each in callbacks if isinstance(each, AccessTokenAuth)), None)
                for method in operation.methods:
                    gates[(method, "/api/v1" + path)] = token_auth
    paths = api.get_openapi_schema()["paths"]
    return [(method.upper(), path, gates.get((method.upper(), path))) for path, methods in paths.items()
            for method in methods]


API_OPERATIONS = api_operations()
