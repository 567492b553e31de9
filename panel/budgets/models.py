from django.conf import settings
from django.db import models


class Budget(models.Model):
    """A monthly ceiling (calendar month, UTC) on a team's gateway spend, on one key's, or on the spend of the team's
    requests that carry one tag (panel/usage/tags.py). Money is in the panel's currency (the channels' prices); a
    blank limit means no ceiling of that kind."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="budgets")
    key = models.ForeignKey("accounts.TeamKey", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    tag = models.CharField(max_length=64, blank=True, default="")  # "": the team's or the key's budget
    money_per_month = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    tokens_per_month = models.PositiveBigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team"], condition=models.Q(key__isnull=True, tag=""),
                                    name="one_team_budget"),
            models.UniqueConstraint(fields=["key"], condition=models.Q(key__isnull=False), name="one_budget_per_key"),
            models.UniqueConstraint(fields=["team", "tag"], condition=~models.Q(tag=""), name="one_budget_per_tag"),
            models.CheckConstraint(condition=models.Q(key__isnull=True) | models.Q(tag=""),
                                   name="budget_of_a_key_or_a_tag"),
        ]

    def __str__(self):
        return f"budget of {self.target_name}"

    @property
    def target_name(self):
        if self.tag:
            return f"tag {self.tag}"
        return f"key {self.key}" if self.key_id else f"team {self.team}"


class BudgetNotice(models.Model):
    """That a budget reached 80% (`alert`) or 100% (`exhausted`) in a month: recorded once, audited once."""

    class Level(models.TextChoices):
        ALERT = "alert", "80% reached"
        EXHAUSTED = "exhausted", "spent"

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="notices")
    month = models.CharField(max_length=7)  # "2026-11"
    level = models.CharField(max_length=10, choices=Level.choices)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["budget", "month", "level"], name="one_notice_per_month")]
