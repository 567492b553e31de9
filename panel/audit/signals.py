from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.dispatch import receiver

from panel.audit.models import AuditAction
from panel.audit.services import audit_record


@receiver(user_logged_in)
def _signed_in(sender, request, user, **_):
    audit_record(action=AuditAction.SIGNIN, request=request, actor=user, target=user.get_username())


@receiver(user_login_failed)
def _signin_failed(sender, credentials, request=None, **_):
    # `credentials` holds the password too: only the username is kept.
    from django.contrib.auth import get_user_model

    username = str(credentials.get("username", ""))[:150]
    account = get_user_model().objects.filter(username=username).first()  # the account being guessed, if any
    audit_record(action=AuditAction.SIGNIN_FAILED, request=request, actor=account, target=username,
                 username=username)
