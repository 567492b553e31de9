"""Evaluation sets: a team's prompts with checks a machine can run on the answers (evaluations/checks.py), kept as
numbered versions that never change once written, so a score always names the exact cases it was taken on."""
from django.conf import settings
from django.db import models

from panel.accounts.roles import may
from panel.jobs.models import Job


class EvalSet(models.Model):
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    # Made of a route's traffic samples (evaluations/from_samples.py): its cases are the team's users' real prompts
    # and answers, so only those who may read samples see it, its versions and its runs (sets_readable).
    from_samples = models.BooleanField(default=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="eval_set_name_unique_per_team")]

    def __str__(self):
        return self.name

    def current(self):
        """The newest version (every set has at least one)."""
        return self.versions.order_by("-number").first()


def sets_readable(membership):
    """The sets of `membership`'s team it may read: all of them for those who may read traffic samples
    (accounts/roles.py `samples.manage`), else those not made of samples."""
    sets = EvalSet.objects.filter(team=membership.team_id)
    return sets if may(membership, "samples.manage") else sets.filter(from_samples=False)


class EvalSetVersion(models.Model):
    """One version of a set: its cases as parsed and checked (evaluations/sets.py), never edited afterwards."""

    eval_set = models.ForeignKey(EvalSet, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    cases = models.JSONField(default=list)  # [{"id", "messages", "checks", "max_tokens"}]
    note = models.CharField(max_length=300, blank=True)  # what changed, in the author's words
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-number"]
        constraints = [models.UniqueConstraint(fields=["eval_set", "number"], name="eval_version_number_unique")]

    def __str__(self):
        return f"{self.eval_set.name} v{self.number}"


class EvalRun(Job):
    """One version of a set answered by one candidate (a channel or a route, as Compare names them: "channel:3"),
    each answer checked (evaluations/runs.py). `results` holds a line per case; `result` the summary."""

    eval_version = models.ForeignKey(EvalSetVersion, on_delete=models.CASCADE, related_name="runs")
    candidate = models.JSONField(default=dict)  # {"kind": "channel"|"route", "id", "label"}
    # One line per case as it is answered: {"id", "passed", "answer", "checks", "ms", "cost", "gpu_cost",
    # "error"}: gpu_cost is the local deployment's GPU time, part of cost (evaluations/runs.py).
    results = models.JSONField(default=list, blank=True)

    class Meta(Job.Meta):
        pass

    def __str__(self):
        return f"evaluation run #{self.pk}"


class Autopilot(models.Model):
    """A route's autopilot (evaluations/autopilot.py): the evaluation set it judges candidates by, the team's
    thresholds, and whether it may start a canary of the cheapest candidate that passes them by itself."""

    route = models.OneToOneField("channels.Route", on_delete=models.CASCADE, related_name="autopilot")
    eval_set = models.ForeignKey(EvalSet, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The version of the set an admin pinned: the evidence the autopilot and a canary's guard go by. A version a
    # member saves later changes nothing until an admin pins it (autopilot_save).
    eval_version = models.ForeignKey(EvalSetVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    min_pass_rate = models.FloatField(default=0.9)  # of the set's cases, and of the shadow copies
    max_drop = models.FloatField(default=0.05)  # a candidate passes at most this much less of the set than the route
    min_shadow_copies = models.PositiveIntegerField(default=20)  # 0: the set alone decides
    start_canary = models.BooleanField(default=False)
    proposal = models.JSONField(default=dict, blank=True)  # the last one sent: {"channel_id", "words", "at"}
    flagged_runs = models.JSONField(default=list, blank=True)  # runs whose regression was notified (ids)
    reviewed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
