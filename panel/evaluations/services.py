"""Evaluation sets: create one from JSONL (or the starter set), save a new version, delete. Every save reads and
checks the whole JSONL first (evaluations/sets.py) and writes nothing when any line is wrong."""
from django.core.exceptions import ValidationError
from django.db import transaction

from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.evaluations import starter
from panel.evaluations.models import EvalSet, EvalSetVersion
from panel.evaluations.sets import SetProblems, parse_cases

MAX_SETS_PER_TEAM = 200


def _cases(text):
    try:
        return parse_cases(text)
    except SetProblems as error:
        raise ValidationError({"cases": error.problems}) from None


@transaction.atomic
def eval_set_create(*, team, user, name, text, description="", request=None):
    """A new set with its first version; ValidationError (saving nothing) for a taken or empty name or any problem
    in the JSONL."""
    name = (name or "").strip()
    errors = {}
    if not name or len(name) > 100:
        errors["name"] = ["A name of 1 to 100 characters."]
    elif EvalSet.objects.filter(team=team, name=name).exists():
        errors["name"] = [f"Your team already has a set named {name!r}."]
    elif EvalSet.objects.filter(team=team).count() >= MAX_SETS_PER_TEAM:
        errors["name"] = [f"A team keeps at most {MAX_SETS_PER_TEAM} sets: delete one first."]
    try:
        cases = _cases(text)
    except ValidationError as error:
        errors.update(error.message_dict)
    if errors:
        raise ValidationError(errors)
    eval_set = EvalSet.objects.create(team=team, name=name, description=(description or "").strip()[:2000],
                                      created_by=user)
    EvalSetVersion.objects.create(eval_set=eval_set, number=1, cases=cases, note="first version", created_by=user)
    audit_record(action=AuditAction.EVAL_SET_SAVED, request=request, team=team, actor=user, target=name,
                 version=1, cases=len(cases))
    return eval_set


def starter_set_add(*, team, user, request=None):
    """The built-in starter set, under its own name (`name (2)` when that is taken)."""
    name, number = starter.NAME, 1
    while EvalSet.objects.filter(team=team, name=name).exists():
        number += 1
        name = f"{starter.NAME} ({number})"
    return eval_set_create(team=team, user=user, name=name, text=starter.starter_jsonl(),
                           description=starter.DESCRIPTION, request=request)


@transaction.atomic
def eval_set_revise(*, eval_set, user, text, note="", description=None, request=None):
    """A new version from JSONL (the earlier ones stay as they were); ValidationError, saving nothing, when any line
    is wrong. A text that gives the same cases as the current version saves no version and returns it."""
    cases = _cases(text)
    current = EvalSet.objects.select_for_update().filter(pk=eval_set.pk).first()
    if current is None:
        raise ValidationError({"cases": ["The set was deleted meanwhile."]})
    latest = eval_set.current()
    if description is not None:
        EvalSet.objects.filter(pk=eval_set.pk).update(description=description.strip()[:2000])
    if latest is not None and latest.cases == cases:
        return latest
    version = EvalSetVersion.objects.create(eval_set=eval_set, number=(latest.number if latest else 0) + 1,
                                            cases=cases, note=(note or "").strip()[:300], created_by=user)
    eval_set.save(update_fields=["updated_at"])
    audit_record(action=AuditAction.EVAL_SET_SAVED, request=request, team=eval_set.team, actor=user,
                 target=eval_set.name, version=version.number, cases=len(cases))
    return version


def eval_set_delete(*, eval_set, user, request=None):
    name, team = eval_set.name, eval_set.team
    eval_set.delete()
    audit_record(action=AuditAction.EVAL_SET_DELETED, request=request, team=team, actor=user, target=name)
