from django.conf import settings
from django.db import models

from panel.audit.display import detail_items


class AuditAction(models.TextChoices):
    SIGNIN = "signin", "Signed in"
    SIGNIN_FAILED = "signin_failed", "Sign-in failed"
    PASSWORD_CHANGED = "password_changed", "Password changed"
    KEY_ISSUED = "key_issued", "Key issued"
    KEY_REVOKED = "key_revoked", "Key revoked"
    CREDENTIAL_CHANGED = "credential_changed", "Channel credential changed"
    CHANNEL_CHANGED = "channel_changed", "Channel base URL or credential kind changed"
    SETTING_CHANGED = "setting_changed", "Installation setting changed"
    JOB_LAUNCHED = "job_launched", "Job launched"
    JOB_CANCELLED = "job_cancelled", "Job cancelled"
    DEPLOYMENT_STARTED = "deployment_started", "Deployment started"
    DEPLOYMENT_STOPPED = "deployment_stopped", "Deployment stopped"
    DEPLOYMENT_SCALING = "deployment_scaling", "Deployment scaling changed"
    MEMBER_ADDED = "member_added", "Member added"
    ROLE_CHANGED = "role_changed", "Role changed"
    MEMBER_REMOVED = "member_removed", "Member removed"
    BUDGET_CHANGED = "budget_changed", "Budget changed"
    STATEMENT_IMPORTED = "statement_imported", "Provider usage export imported"
    BUDGET_ALERT = "budget_alert", "Budget reached 80%"
    BUDGET_EXHAUSTED = "budget_exhausted", "Budget spent"
    CANARY_STARTED = "canary_started", "Canary started"
    CANARY_PROMOTED = "canary_promoted", "Canary promoted"
    CANARY_ROLLED_BACK = "canary_rolled_back", "Canary rolled back"
    CANARY_STOPPED = "canary_stopped", "Canary stopped"
    BENCHMARK_LAUNCHED = "benchmark_launched", "Benchmark launched"
    TOKEN_ISSUED = "token_issued", "Access token issued"
    TOKEN_REVOKED = "token_revoked", "Access token revoked"
    WEBHOOK_CHANGED = "webhook_changed", "Webhook changed"
    ROUTE_RULE_CHANGED = "route_rule_changed", "Route rule changed"
    REFUSED = "refused", "Authorization refused"
    EVAL_SET_SAVED = "eval_set_saved", "Evaluation set saved"
    EVAL_SET_DELETED = "eval_set_deleted", "Evaluation set deleted"
    ROUTE_SAMPLING_CHANGED = "route_sampling_changed", "Traffic samples changed"
    SAMPLES_DELETED = "samples_deleted", "Traffic samples deleted"
    SHADOW_STARTED = "shadow_started", "Shadow test started"
    SHADOW_STOPPED = "shadow_stopped", "Shadow test stopped"
    AUTOPILOT_CHANGED = "autopilot_changed", "Autopilot changed"
    AUTOPILOT_PROPOSED = "autopilot_proposed", "Autopilot proposed a candidate"
    AUTOPILOT_RECHECKED = "autopilot_rechecked", "Autopilot re-ran an evaluation set after a change"
    ADAPTER_REGISTERED = "adapter_registered", "LoRA adapter registered"
    ADAPTER_REMOVED = "adapter_removed", "LoRA adapter removed"
    ADAPTER_LOADED = "adapter_loaded", "LoRA adapter loaded"
    ADAPTER_UNLOADED = "adapter_unloaded", "LoRA adapter unloaded"
    OWNER_KEPT = "owner_kept", "Last owner kept"


class AppendOnlyQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise PermissionError("the audit log is append-only")

    def delete(self):
        raise PermissionError("the audit log is append-only")


class AuditEvent(models.Model):
    """One thing that happened: who, in which team, when (UTC), what, from where. Never a secret or a prompt.
    Rows are only ever inserted: updates and deletes raise, in the ORM, the admin and the pages."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    team = models.ForeignKey("accounts.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    actor_name = models.CharField(max_length=150, blank=True)  # kept if the user is deleted
    action = models.CharField(max_length=30, choices=AuditAction.choices, db_index=True)
    target = models.CharField(max_length=300, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    address = models.GenericIPAddressField(null=True, blank=True)

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise PermissionError("the audit log is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("the audit log is append-only")

    def detail_items(self):
        """The details in words for the audit page (panel/audit/display.py)."""
        return detail_items(self.detail)
