"""What happened that a team wants to hear about (`Notification`), where the team wants to hear it (`Webhook`), and
each try to tell it (`Delivery`, `DeliveryAttempt`)."""
from django.conf import settings
from django.db import models


class EventKind(models.TextChoices):
    BUDGET_ALERT = "budget.alert", "Budget reached 80%"
    BUDGET_EXHAUSTED = "budget.exhausted", "Budget spent"
    DEPLOYMENT_FAILED = "deployment.failed", "Deployment crashed or failed to start"
    CANARY_ROLLED_BACK = "canary.rolled_back", "Canary rolled back"
    JOB_FAILED = "job.failed", "Job failed"
    CHANNEL_COOLED_DOWN = "channel.cooled_down", "Channel cooled down"
    LEDGER_MISMATCH = "ledger.mismatch", "An engine counted more than 1% more or fewer tokens than was charged"
    STATEMENT_MISMATCH = "statement.mismatch", "A provider's usage export differs from the usage rows by more than 1%"
    SHADOW_ENDED = "shadow.ended", "A shadow test stopped itself (budget spent or candidate failing)"
    AUTOPILOT_PROPOSAL = "autopilot.proposal", "The autopilot found a cheaper candidate that passes"
    EVALUATION_REGRESSION = "evaluation.regression", "A channel passes less of a route's evaluation set than before"
    TEST = "test", "Test message"


SUBSCRIBABLE = [kind for kind in EventKind.values if kind != EventKind.TEST]


class WebhookFormat(models.TextChoices):
    JSON = "json", "Tokenwise JSON"
    SLACK = "slack", "Slack-compatible ({\"text\": …})"


class Webhook(models.Model):
    """A team's receiver: an HTTP(S) URL that gets a signed POST for each event it subscribes to."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="webhooks")
    name = models.CharField(max_length=100)
    url = models.CharField(max_length=500)
    format = models.CharField(max_length=10, choices=WebhookFormat.choices, default=WebhookFormat.JSON)
    events = models.JSONField(default=list, blank=True)  # [] = every kind
    # The signing secret, encrypted like upstream credentials (core/crypto.py); shown once, when made.
    secret_ciphertext = models.TextField()
    secret_last4 = models.CharField(max_length=4)
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_webhook_name_per_team")]

    def __str__(self):
        return self.name

    def wants(self, kind):
        return self.enabled and (kind == EventKind.TEST or not self.events or kind in self.events)


class Notification(models.Model):
    """One event of a team, recorded in the same transaction as the state that caused it."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=30, choices=EventKind.choices)
    title = models.CharField(max_length=300)
    facts = models.JSONField(default=dict, blank=True)  # names, ids, numbers: never a secret or a prompt
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Waiting"
    SENDING = "sending", "Sending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Gave up"


class Delivery(models.Model):
    """One notification to one webhook, tried until the receiver answers 2xx or WEBHOOK_MAX_ATTEMPTS are spent."""

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(max_length=10, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="notif_delivery_due_idx")]


class DeliveryAttempt(models.Model):
    """One POST to a receiver: what it answered (or why there was no answer) and how long it took."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    at = models.DateTimeField(auto_now_add=True)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    duration_ms = models.FloatField()

    class Meta:
        ordering = ["-at", "-id"]
