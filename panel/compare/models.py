"""Saved Compare conversations: the columns a user picked, and every message of every column (each column keeps
its own history, so a follow-up goes to each model with that model's own earlier answers)."""
from django.conf import settings
from django.db import models


class Conversation(models.Model):
    """One side-by-side chat. Its columns are fixed when it starts: a follow-up with other columns starts a new one.

    `columns` is a list of {"kind": "channel"|"route", "id": int, "label": str}; the label is kept so a conversation
    still reads right after a channel was renamed or deleted."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    title = models.CharField(max_length=200)
    columns = models.JSONField(default=list)
    system_prompt = models.TextField(blank=True)
    temperature = models.FloatField(default=0.7)
    top_p = models.FloatField(default=1.0)
    max_tokens = models.PositiveIntegerField(default=256)
    shared = models.BooleanField(default=False)  # readable by everyone in the team
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["team", "owner", "updated_at"])]

    def __str__(self):
        return self.title


class MessageRole(models.TextChoices):
    USER = "user", "User"
    ASSISTANT = "assistant", "Assistant"


class Message(models.Model):
    """One message in one column. An assistant message that failed keeps its diagnosis in `metrics["error"]` and
    is left out of the history sent with the next follow-up."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    column = models.PositiveSmallIntegerField()
    role = models.CharField(max_length=10, choices=MessageRole.choices)
    content = models.TextField(blank=True)
    metrics = models.JSONField(default=dict, blank=True)  # ttft_ms, tokens_per_second, tokens, latency, cost, error
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation", "column", "pk"]

    def __str__(self):
        return f"{self.conversation_id}/{self.column} {self.role}"

    @property
    def failed(self):
        return bool(self.metrics.get("error"))
