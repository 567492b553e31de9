"""The identity provider's authentication backend: mozilla-django-oidc's code flow (state, nonce, PKCE, the id
token's signature against the provider's keys) with the panel's rules on top: the id token's issuer and audience
checked, the user info's subject the id token's, the person found by issuer and subject, their teams and roles
from their groups (services.identity_sign_in). A refusal stops Django's other backends (the password throttle counts
nothing) and its reason waits in the session for the refused page."""
import logging

import requests
from django.conf import settings
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.sso.services import SignInRefused, identity_sign_in

logger = logging.getLogger(__name__)
REFUSAL_KEY = "sso_refusal"  # the session key the refused page reads


class ProviderBackend(OIDCAuthenticationBackend):
    def authenticate(self, request, **kwargs):
        if request is None or "nonce" not in kwargs:
            return None  # not the provider's callback (the password form, the admin site)
        try:
            user = super().authenticate(request, **kwargs)
        except SignInRefused as refusal:
            self._refuse(request, str(refusal), audit=str(refusal))
        except (requests.RequestException, SuspiciousOperation, ValueError, KeyError) as error:
            logger.warning("single sign-on failed: %s: %s", type(error).__name__, error)
            self._refuse(request, f"{settings.SSO_NAME} did not confirm the sign-in; try again, and if it fails "
                                  "again tell an administrator (the panel's log says why).", audit=type(error).__name__)
        if user is None:
            self._refuse(request, f"{settings.SSO_NAME} did not confirm the sign-in.", audit="no user")
        return user

    def get_or_create_user(self, access_token, id_token, payload):
        audience = payload.get("aud")
        if payload.get("iss") != settings.SSO_ISSUER:
            raise SuspiciousOperation(f"the id token's issuer {payload.get('iss')!r} is not TOKENWISE_OIDC_ISSUER")
        if self.OIDC_RP_CLIENT_ID not in (audience if isinstance(audience, list) else [audience]):
            raise SuspiciousOperation("the id token was issued for another client")
        claims = self.get_userinfo(access_token, id_token, payload)
        if claims.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("the user info names another subject than the id token")
        return identity_sign_in(issuer=settings.SSO_ISSUER, claims=claims, groups_claim=settings.SSO_GROUPS_CLAIM,
                                group_map=settings.SSO_GROUP_MAP, request=self.request)

    def _refuse(self, request, reason, *, audit):
        # The callback view gave the request a fresh session object before authenticating: write to that one.
        request.session[REFUSAL_KEY] = reason
        audit_record(action=AuditAction.SIGNIN_FAILED, request=request, target=f"single sign-on ({settings.SSO_NAME})",
                     reason=audit[:300])
        raise PermissionDenied(reason)
