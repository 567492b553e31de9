"""A route's traffic samples, as its admins set them: how many a day, how long they are kept, what is redacted
(the samples themselves are kept by panel/usage/samples.py, off the gateway's request path)."""
from django.core.exceptions import ValidationError
from django.db import transaction

from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.channels.routing import routing_changed
from panel.usage import samples


@transaction.atomic
def route_sampling_save(*, route, user, per_day, retention_days, redactions="", request=None):
    """Set how the route keeps samples (per_day 0: none). ValidationError, saving nothing, for a value out of bounds
    or a redaction pattern that is not a safe regular expression. The gateway learns of it with the routing."""
    errors = {}
    if isinstance(per_day, bool) or not isinstance(per_day, int) or not 0 <= per_day <= samples.MAX_PER_DAY:
        errors["samples_per_day"] = [f"A whole number from 0 (keep none) to {samples.MAX_PER_DAY}."]
    if (isinstance(retention_days, bool) or not isinstance(retention_days, int)
            or not 1 <= retention_days <= samples.MAX_RETENTION_DAYS):
        errors["sample_retention_days"] = [f"A whole number of days from 1 to {samples.MAX_RETENTION_DAYS}."]
    problems = samples.redaction_problems(redactions)
    if problems:
        errors["sample_redactions"] = problems
    if errors:
        raise ValidationError(errors)
    redactions = "\n".join(samples.redaction_lines(redactions))
    before = (route.samples_per_day, route.sample_retention_days, route.sample_redactions)
    type(route).objects.filter(pk=route.pk).update(samples_per_day=per_day, sample_retention_days=retention_days,
                                                   sample_redactions=redactions)
    route.samples_per_day, route.sample_retention_days, route.sample_redactions = per_day, retention_days, redactions
    if before != (per_day, retention_days, redactions):
        routing_changed(route.team_id)
        audit_record(action=AuditAction.ROUTE_SAMPLING_CHANGED, request=request, team=route.team, actor=user,
                     target=route.model_name, samples_per_day=per_day, retention_days=retention_days,
                     redaction_patterns=len(samples.redaction_lines(redactions)))
    return route


def route_samples_delete(*, route, user, request=None):
    """Delete every sample the route kept; how many went."""
    deleted, _ = route.samples.all().delete()
    audit_record(action=AuditAction.SAMPLES_DELETED, request=request, team=route.team, actor=user,
                 target=route.model_name, deleted=deleted)
    return deleted


def sampling_words(route):
    """What the route does with its traffic, for its page."""
    if not route.samples_per_day:
        return "Off: this route keeps none of its requests."
    own = len(samples.redaction_lines(route.sample_redactions))
    redacted = ", ".join(name for name, _ in samples.BUILT_IN_REDACTIONS)
    team = (" and whatever your team's pattern matches" if own == 1
            else f" and whatever your team's {own} patterns match" if own else "")
    return (f"On: this route keeps up to {route.samples_per_day:,} of its answered requests a day (the conversation "
            f"and the answer the client got) as evaluation material. Before they are stored, {redacted}{team} are "
            f"replaced by {samples.REDACTED}; they are kept encrypted and deleted after "
            f"{route.sample_retention_days} day{'s' if route.sample_retention_days != 1 else ''}.")
