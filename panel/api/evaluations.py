"""Evaluation sets (as on Evaluations): list, create from JSONL (or add the starter set), read a set with its current
cases, save a new version, read a version's JSONL, delete. A JSONL with any bad line saves nothing: 400 with every
problem under errors.cases."""
import datetime
from typing import Any

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from ninja import Field, Router, Schema

from panel.api.auth import gate
from panel.api.errors import errors
from panel.evaluations.models import sets_readable
from panel.evaluations.services import eval_set_create, eval_set_delete, eval_set_revise, starter_set_add
from panel.evaluations.sets import MAX_BYTES, cases_jsonl

router = Router(tags=["evaluations"])


class VersionOut(Schema):
    number: int
    note: str
    cases: int
    created_at: datetime.datetime
    created_by: str | None


class EvalSetOut(Schema):
    id: int
    name: str
    description: str
    version: int = Field(description="The current (newest) version's number.")
    cases: list[dict[str, Any]] = Field(description="The current version's cases: id, messages, checks, max_tokens.")
    versions: list[VersionOut]


class EvalSetIn(Schema):
    name: str = Field(..., max_length=100)
    description: str = Field("", max_length=2000)
    jsonl: str = Field(..., max_length=MAX_BYTES, description="One case per line, as on the page.")


class RevisionIn(Schema):
    jsonl: str = Field(..., max_length=MAX_BYTES)
    note: str = Field("", max_length=300, description="What changed.")


def set_out(eval_set):
    versions = list(eval_set.versions.select_related("created_by"))
    return {"id": eval_set.pk, "name": eval_set.name, "description": eval_set.description,
            "version": versions[0].number, "cases": versions[0].cases,
            "versions": [{"number": v.number, "note": v.note, "cases": len(v.cases), "created_at": v.created_at,
                          "created_by": v.created_by.username if v.created_by else None} for v in versions]}


def _set(request, set_id):
    return get_object_or_404(sets_readable(request.membership), pk=set_id)


@router.get("/eval-sets", auth=gate("evaluations.view"), response=errors({200: list[EvalSetOut]}))
def eval_sets_list(request):
    return [set_out(eval_set) for eval_set in sets_readable(request.membership)]


@router.post("/eval-sets", auth=gate("evaluations.edit"), response=errors({201: EvalSetOut}))
def eval_sets_create(request, body: EvalSetIn):
    eval_set = eval_set_create(team=request.team, user=request.user, name=body.name, text=body.jsonl,
                               description=body.description, request=request)
    return 201, set_out(eval_set)


@router.post("/eval-sets/starter", auth=gate("evaluations.edit"), response=errors({201: EvalSetOut}),
             summary="Add the built-in starter set")
def eval_sets_starter(request):
    return 201, set_out(starter_set_add(team=request.team, user=request.user, request=request))


@router.get("/eval-sets/{set_id}", auth=gate("evaluations.view"), response=errors({200: EvalSetOut}))
def eval_sets_get(request, set_id: int):
    return set_out(_set(request, set_id))


@router.post("/eval-sets/{set_id}/versions", auth=gate("evaluations.edit"), response=errors({200: EvalSetOut}),
             summary="Save a new version (none when the cases are the current version's)")
def eval_sets_revise(request, set_id: int, body: RevisionIn):
    eval_set = _set(request, set_id)
    eval_set_revise(eval_set=eval_set, user=request.user, text=body.jsonl, note=body.note, request=request)
    return set_out(eval_set)


@router.get("/eval-sets/{set_id}/versions/{number}/jsonl", auth=gate("evaluations.view"),
            response=errors({200: str}), summary="A version's cases as JSONL")
def eval_sets_jsonl(request, set_id: int, number: int):
    version = get_object_or_404(_set(request, set_id).versions, number=number)
    return HttpResponse(cases_jsonl(version.cases), content_type="application/jsonl; charset=utf-8")


@router.delete("/eval-sets/{set_id}", auth=gate("evaluations.edit"), response=errors({204: None}))
def eval_sets_delete(request, set_id: int):
    eval_set_delete(eval_set=_set(request, set_id), user=request.user, request=request)
    return 204, None
