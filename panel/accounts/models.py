from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.text import slugify


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


# Higher rank may do everything a lower rank may.
ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Whether members issue gateway keys for themselves (admins always may), and the most such a key may allow per
    # minute (None: no cap): panel/accounts/keys.py, member_key_limits.
    member_keys = models.BooleanField(default=False)
    member_key_rpm_limit = models.PositiveIntegerField(null=True, blank=True)
    member_key_tpm_limit = models.PositiveIntegerField(null=True, blank=True)
    # The most GPUs the team's deployments may hold at once (None: no limit), set by an owner on the Members page and
    # checked at every launch (panel/serving/quota.py). A CPU host's deployments hold none.
    gpu_quota = models.PositiveIntegerField(null=True, blank=True)
    # The prompt and answer text of the team's gateway requests in their OpenTelemetry spans (panel/gateway/tracing.py),
    # set by an owner on the Members page; off: spans carry figures and names, never the text.
    trace_prompts = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def save(self, *args, **kwargs):
        if not self.slug:
            self.slug = slugify(self.name)[:100] or "team"
        super().save(*args, **kwargs)


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")]
        ordering = ["team__name"]

    def __str__(self):
        return f"{self.user} in {self.team} ({self.role})"

    def allows(self, role):
        """True when this membership's role is at least `role`."""
        return ROLE_RANK[Role(self.role)] >= ROLE_RANK[Role(role)]


class TeamKey(models.Model):
    """A key for the gateway. Only its SHA-256 and its last four characters are stored; the key is shown once."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="keys")
    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True)
    last4 = models.CharField(max_length=4)
    allowed_models = models.JSONField(default=list, blank=True)  # [] = every route of the team
    rpm_limit = models.PositiveIntegerField(null=True, blank=True)
    tpm_limit = models.PositiveIntegerField(null=True, blank=True)
    # A request whose max_tokens does not fit in what a budget has left goes with max_tokens lowered to fit, instead
    # of a 402 (the answer may end early: its stop reason says so).
    fit_to_budget = models.BooleanField(default=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        db_table = "gateway_teamkey"  # created by the gateway app, which held the model first

    def __str__(self):
        return f"{self.name} (…{self.last4})"

    @property
    def masked(self):
        return f"tw-…{self.last4}"

    @property
    def status(self):
        if self.revoked_at:
            return "revoked"
        if self.expires_at and self.expires_at <= timezone.now():
            return "expired"
        return "active"


class AccessToken(models.Model):
    """A personal access token for the management API: one person in one team, acting with their role there (or a
    lower one, when issued so). Like a gateway key, only its SHA-256 and last four characters are stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="access_tokens")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="access_tokens")
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True)
    last4 = models.CharField(max_length=4)
    # The most this token may do; the member's role in the team at the time of use caps it again.
    role = models.CharField(max_length=10, choices=Role.choices)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.name} (…{self.last4})"

    @property
    def masked(self):
        return f"twp-…{self.last4}"

    @property
    def status(self):
        if self.revoked_at:
            return "revoked"
        if self.expires_at and self.expires_at <= timezone.now():
            return "expired"
        return "active"


class Invitation(models.Model):
    """A team's invitation to an account that already exists: it gives nothing until that account, signed in,
    accepts it (an email address alone never binds an account to a team)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="invitations")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_invitation_per_team_and_user")]


class InvitedAccount(models.Model):
    """An account a team's invitation by email created: which team and admin made it. Tokenwise sends no mail, so its
    email address is that admin's word, and whoever they gave the set-password link to holds it: the address binds
    the account to no other team (`member_invite` refuses another team's invitation by email) until a superuser,
    having checked it, ticks email_verified on the admin site."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="invited_account")
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    team_name = models.CharField(max_length=100)  # still said once the team is gone
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    email_verified = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"{self.user} (invited to {self.team_name})"

    def binds_by_email(self, team):
        """Whether `team` may find this account by its email address: only the team that created it, or anyone
        once the address was verified."""
        return self.email_verified or self.team_id == team.pk
