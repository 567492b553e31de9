"""Signing in through the identity provider: the account an identity opens, and its teams and roles set from its
groups at every sign-in (panel/sso/mapping.py says which groups give what)."""
import logging
import re

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from panel.accounts.models import Membership, Role, Team
from panel.accounts.services import last_owner, membership_add, membership_end
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.sso.mapping import grants_for, groups_in, teams_named
from panel.sso.models import Identity

logger = logging.getLogger(__name__)
PROVIDER = "identity provider"  # who the audit log names for a change the provider's groups made


class SignInRefused(Exception):
    """The provider vouched for the person, but the panel lets them in nowhere. The message is for them."""


def identity_sign_in(*, issuer, claims, groups_claim, group_map, request=None):
    """The account of the identity in `claims` (the provider's user info) at `issuer`, its memberships in the teams
    `group_map` names set to what its groups give: added, changed, and removed where a group is gone; memberships in
    teams the mapping does not name are left alone. An identity whose groups give no team is refused
    (SignInRefused): a new one gets no account, a known one loses its mapped memberships and is refused."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise SignInRefused("The identity provider did not say who you are (its answer had no subject).")
    groups = groups_in(claims.get(groups_claim))
    grants = grants_for(groups, group_map)
    teams = {team.slug: team for team in Team.objects.filter(slug__in=grants)}
    for slug in sorted(grants.keys() - teams.keys()):
        logger.warning("TOKENWISE_OIDC_GROUPS names the team %r, which does not exist: its groups give nothing", slug)
    with transaction.atomic():
        identity = Identity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
        if identity is None and not teams:
            raise SignInRefused(_refusal(groups))
        if identity is None:
            identity = Identity(issuer=issuer, subject=subject, user=_account_create(claims))
        identity.groups = groups
        identity.last_signin_at = timezone.now()
        identity.save()
        memberships_sync(user=identity.user, roles={teams[slug]: role for slug, role in grants.items()
                                                    if slug in teams},
                         managed=teams_named(group_map), request=request)
    if not teams:
        raise SignInRefused(_refusal(groups))
    return identity.user


def memberships_sync(*, user, roles, managed, request=None):
    """Make `user`'s memberships in the teams whose slugs are in `managed` exactly `roles` ({Team: role}), each
    change audited. A membership that ends takes its member's tokens and own keys with it, as a removal in the panel
    does. A team's last owner stays its owner whatever the groups say (audited as kept, and logged): a team without
    an owner could not be managed, and the panel's own pages refuse the same change."""
    current = {membership.team_id: membership for membership in
               Membership.objects.select_for_update().filter(user=user, team__slug__in=managed).select_related("team")}
    for team, role in roles.items():
        membership = current.pop(team.pk, None)
        if membership is not None and membership.role == role:
            continue
        if membership is not None and role != Role.OWNER and last_owner(membership):
            _owner_kept(membership, role, request)
            continue
        membership_add(team=team, user=user, role=role)
        action = AuditAction.MEMBER_ADDED if membership is None else AuditAction.ROLE_CHANGED
        audit_record(action=action, request=request, team=team, target=user.get_username(), role=role,
                     username=PROVIDER)
    for membership in current.values():
        if last_owner(membership):
            _owner_kept(membership, None, request)
            continue
        membership_end(membership=membership, request=request, username=PROVIDER)
        audit_record(action=AuditAction.MEMBER_REMOVED, request=request, team=membership.team,
                     target=user.get_username(), role=membership.role, username=PROVIDER)


def _owner_kept(membership, role, request):
    """The provider's groups would take the team's last owner away (`role`: the lower role, None: out): kept."""
    change = f"the role {role}" if role else "no membership"
    logger.warning("%s is the last owner of team %s: kept as owner, though the identity provider's groups give %s "
                   "(make someone else an owner, or map a group of theirs to owner)", membership.user,
                   membership.team.slug, change)
    audit_record(action=AuditAction.OWNER_KEPT, request=request, team=membership.team,
                 target=membership.user.get_username(), role=Role.OWNER, groups_give=role or "none",
                 username=PROVIDER)


def _refusal(groups):
    listed = ", ".join(groups) if groups else "none"
    return ("Your identity provider lists you in no group that gives access to a team here (your groups: "
            f"{listed}). Ask an administrator to add you to a group that is mapped to a team.")


def _account_create(claims):
    """A new account for an identity: a free username from its preferred username or e-mail, no usable password
    (it signs in through the provider only)."""
    User = get_user_model()
    email = claims.get("email") if isinstance(claims.get("email"), str) else ""
    wanted = claims.get("preferred_username") or email.split("@", 1)[0] or claims["sub"]
    base = re.sub(r"[^\w.@+-]", "", str(wanted))[:140] or "user"
    name, n = base, 1
    while User.objects.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}{n}"
    user = User(username=name, email=email if claims.get("email_verified", True) is not False else "")
    user.set_unusable_password()
    user.save()
    return user
