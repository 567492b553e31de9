"""Which teams and roles an identity provider's groups give. TOKENWISE_OIDC_GROUPS is a JSON object of group name to
{team slug: role}, for example {"ml-admins": {"ml": "admin"}, "ml": {"ml": "member", "demo": "viewer"}}. It is read
and checked when the settings load, so nothing here imports a model (the apps are not ready then)."""
import json

from panel.env import TEAM_SLUG_RE, EnvError

# panel.accounts.models.Role's values, lowest first (tests/sso/test_mapping.py holds the two together).
ROLES = ("viewer", "member", "admin", "owner")
EXAMPLE = '{"ml-admins": {"ml": "admin"}, "ml": {"ml": "member"}}'


def group_map_parse(name, text):
    """The mapping in `text` (the value of the variable `name`) as {group: {team slug: role}}; EnvError, naming the
    variable and the entry, when it is not one."""
    if not text.strip():
        raise EnvError(f"{name} is not set: without it no one can sign in through the identity provider "
                       f"(a JSON object of group to {{team slug: role}}, for example {EXAMPLE})")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise EnvError(f"{name} is not JSON ({error.msg} at character {error.pos})") from None
    if not isinstance(value, dict) or not value:
        raise EnvError(f"{name} must be a JSON object of group to {{team slug: role}}, for example {EXAMPLE}")
    for group, grants in value.items():
        if not group.strip():
            raise EnvError(f"{name}: a group name is empty")
        if not isinstance(grants, dict) or not grants:
            raise EnvError(f"{name}: group {group!r} must map to an object of team slug to role, for example "
                           '{"ml": "member"}')
        for team, role in grants.items():
            if not TEAM_SLUG_RE.match(team):
                raise EnvError(f"{name}: group {group!r} names {team!r}, which is not a team's slug (letters, digits, "
                               "'-', '_')")
            if role not in ROLES:
                raise EnvError(f"{name}: group {group!r} gives team {team!r} the role {role!r}; a role is one of "
                               f"{', '.join(ROLES)}")
    return value


def groups_in(value):
    """The group names in a groups claim: a list of names, or one name alone; anything else is no group."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return sorted({item for item in value if isinstance(item, str) and item})


def grants_for(groups, group_map):
    """{team slug: role} that `groups` give; where two groups name one team, the higher role."""
    grants = {}
    for group in groups:
        for team, role in group_map.get(group, {}).items():
            if team not in grants or ROLES.index(role) > ROLES.index(grants[team]):
                grants[team] = role
    return grants


def teams_named(group_map):
    """The slugs of every team the mapping names: their memberships follow the provider's groups."""
    return {team for grants in group_map.values() for team in grants}
