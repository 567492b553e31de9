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
    """(method, path, view) for every operation of the management API."""
    from panel.api.urls import api

    found = []
    for prefix, router in api._routers:
        for path, path_view in router.path_operations.items():
            for operation in path_view.operations:
                for method in operation.methods:
                    found.append((method, "/api/v1" + (prefix + path).replace("//", "/"), operation.view_func))
    return found


API_OPERATIONS = api_operations()
