from django.conf import settings
from django.db import models


class Identity(models.Model):
    """A person at the identity provider, known by the provider's issuer and its stable subject for them, and the
    panel account their sign-ins open. Never found by e-mail or username: an identity that claims a local account's
    address or name gets an account of its own, so it never takes a local account over."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity")
    issuer = models.CharField(max_length=300)
    subject = models.CharField(max_length=255)
    groups = models.JSONField(default=list, blank=True)  # as the provider sent them at the last sign-in
    created_at = models.DateTimeField(auto_now_add=True)
    last_signin_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="one_account_per_identity")]

    def __str__(self):
        return f"{self.user} ({self.subject} at {self.issuer})"
