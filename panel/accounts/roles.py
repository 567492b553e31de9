"""Who may do what: the one place roles are decided. Every page view names its action
(`@team_view("models.register")`) and so does every API operation (`auth=gate("models.register")`); a page and an
API operation that do the same thing share one action, so the two cannot drift apart. A name missing here raises
where it is used, at import time. tests/accounts/test_roles.py checks that every view and operation names one and
that every action here is used."""
from panel.accounts.models import Role

ACTIONS = {
    # accounts: the team, Your account, Members, the audit log
    "team.view": Role.VIEWER,  # the overview page; GET /team
    "account.view": Role.VIEWER,  # Your account and the tokens listed on it
    "account.password": Role.VIEWER,  # change one's own password
    "tokens.create": Role.VIEWER,  # a personal access token acts with at most its member's role
    "tokens.revoke": Role.VIEWER,
    "members.manage": Role.ADMIN,  # invite, change a role, remove (the owner rules are the services')
    "team.gpu_quota": Role.OWNER,  # an admin could otherwise lift the limit the owner set
    "team.trace_prompts": Role.OWNER,  # the team's prompts leave the panel in its traces
    "audit.view": Role.ADMIN,
    # gateway: team keys
    "keys.view": Role.VIEWER,
    "keys.manage": Role.ADMIN,  # issue and revoke any key; let members issue their own
    "keys.issue_own": Role.MEMBER,  # issue and revoke one's own keys, where the team lets members (keys.py)
    # channels: channels, routes and their rules, canaries, settings.json
    "channels.view": Role.VIEWER,  # channels and routes
    "channels.edit": Role.ADMIN,  # add, change, delete a channel or its credential
    "channels.test": Role.MEMBER,  # the Test button: one request through the channel
    "routes.edit": Role.ADMIN,  # add, change, delete a route or its rules; attach a deployment to a route
    "canaries.run": Role.ADMIN,  # start, promote, roll back, stop
    "shadows.run": Role.ADMIN,  # start or stop a shadow test (its copies cost money)
    "autopilot.manage": Role.ADMIN,  # a route's autopilot: its set, thresholds, canaries; review it now
    "settings.export": Role.VIEWER,
    "settings.import": Role.ADMIN,
    # notifications
    "webhooks.manage": Role.ADMIN,
    # hosts: GPU workers
    "hosts.view": Role.VIEWER,
    "hosts.check": Role.MEMBER,  # run an engine check on a worker
    "hosts.price": Role.ADMIN,  # set a worker's GPU price
    # dashboards, advisor
    "usage.view": Role.VIEWER,  # dashboards, requests, My usage, the CSV export
    "statements.import": Role.ADMIN,  # a provider's usage export, compared with the usage rows
    "advisor.view": Role.VIEWER,
    # compare
    "compare.view": Role.VIEWER,
    "compare.send": Role.MEMBER,  # send a turn, check its replies, share the conversation
    # evaluations: sets of prompts with checks
    "evaluations.view": Role.VIEWER,  # the sets, their versions and their JSONL
    "evaluations.edit": Role.MEMBER,  # create, add the starter set, save a new version, delete
    "evaluations.run": Role.MEMBER,  # run a set on a channel or route (its requests cost what the channel costs)
    # Real requests of the team's users: turn a route's samples on or off, read them, make a set of them, delete them
    "samples.manage": Role.ADMIN,
    # registry: models, quantization, quality reports
    "models.view": Role.VIEWER,  # models, quantization jobs, quality reports
    "models.register": Role.MEMBER,
    "models.quantize": Role.MEMBER,  # start or cancel a quantization job
    "models.evaluate": Role.MEMBER,  # start or cancel a quality report
    # serving: profiles and deployments
    "serving.view": Role.VIEWER,  # profiles, their exports, deployments and their logs
    "profiles.edit": Role.MEMBER,  # create, change, import
    "deployments.run": Role.MEMBER,  # launch and stop
    # budgets
    "budgets.view": Role.VIEWER,
    "budgets.edit": Role.ADMIN,
    # benchmarks: runs, ladders, sweeps
    "benchmarks.view": Role.VIEWER,
    "benchmarks.run": Role.MEMBER,  # start, import, cancel, remove
}

# What a member may do only to what they made themself: to what another made (or what has no known maker, such as
# a profile saved before makers were kept), the role named here. A profile is what its deployments serve on the
# team's routes, so changing or launching another's is an admin's choice.
OTHERS = {
    "profiles.edit": Role.ADMIN,  # change another's profile (its model, extra arguments, template)
    "deployments.run": Role.ADMIN,  # launch another's profile
}


def role_for(action):
    """The least role that may do `action`; a name not in ACTIONS raises LookupError."""
    try:
        return ACTIONS[action]
    except KeyError:
        raise LookupError(f"{action!r} is not an action in panel/accounts/roles.py") from None


def may(membership, action):
    """True when `membership` may do `action` (for the buttons a page shows, and checks inside a view)."""
    return membership.allows(role_for(action))


def may_on(membership, action, created_by_id):
    """True when `membership` may do `action` to something `created_by_id` made: its maker with the action's own
    role, anyone else (anyone at all, where the maker is unknown) with the role OTHERS names for it."""
    if not may(membership, action):
        return False
    if created_by_id is not None and created_by_id == membership.user_id:
        return True
    return membership.allows(OTHERS.get(action, role_for(action)))
