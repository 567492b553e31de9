"""The Compare page and its JSON/NDJSON endpoints. The views are sync (the team gate, the ORM); the streams they
return are async generators that Django's ASGI handler drives on the event loop and cancels when the browser
goes away, which closes the upstream requests (relay.py)."""
import json
from contextlib import aclosing

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import Http404, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from panel.accounts.decorators import team_view
from panel.accounts.roles import may
from panel.compare import checks, services
from panel.compare.relay import stream_chat
from panel.compare.services import CompareError
from panel.core import safejson
from panel.gateway.panel_requests import CandidateError, candidate_resolve, candidate_spec


def _error(error):
    return JsonResponse({"error": str(error), "field": error.field}, status=error.status)


def _body(request):
    try:
        data = safejson.loads(request.body or b"{}")
    except ValueError:  # UnicodeDecodeError included
        raise CompareError("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise CompareError("the request body must be a JSON object")
    return data


async def _ndjson(events):
    async with aclosing(events) as source:
        async for event in source:
            yield (json.dumps(event) + "\n").encode()


def _stream(events):
    response = StreamingHttpResponse(_ndjson(events), content_type="application/x-ndjson")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold the stream back
    return response


def _compare_page(request, conversation=None):
    team, user = request.team, request.user
    can_send = may(request.membership, "compare.send")
    context = {
        "choices": services.column_choices(team=team) if can_send else [],
        "defaults": services.columns_default(team=team) if can_send else [],
        "conversations": services.conversations_visible(team=team, user=user)[:50],
        "conversation": conversation,
        "saved": services.conversation_columns(conversation) if conversation else None,
        "mine": conversation is None or conversation.owner_id == user.pk,
        "can_send": can_send,
        "sampling": {"temperature": conversation.temperature if conversation else 0.7,
                     "top_p": conversation.top_p if conversation else 1.0,
                     "max_tokens": conversation.max_tokens if conversation else 256},
        "max_tokens_limit": settings.GATEWAY_MAX_TOKENS,
        "max_columns": services.MAX_COLUMNS,
        "json_alarm_percent": checks.JSON_ALARM_RATE * 100,
    }
    return render(request, "compare/page.html", context)


@team_view("compare.view")
@require_GET
def compare(request):
    return _compare_page(request)


@team_view("compare.view")
@require_GET
def compare_conversation(request, conversation_id):
    try:
        conversation = services.conversation_get(team=request.team, user=request.user,
                                                 conversation_id=conversation_id)
    except CandidateError as error:
        raise Http404(str(error)) from None
    return _compare_page(request, conversation)


@team_view("compare.send")
@require_POST
def compare_send(request):
    """Save the user's message in every column; the page then opens one stream per column."""
    try:
        data = _body(request)
        conversation = services.conversation_send(
            team=request.team, user=request.user, conversation_id=data.get("conversation") or None,
            column_keys=data.get("columns"), system_prompt=services.system_prompt_clean(data),
            message=services.message_clean(data), **services.sampling_clean(data))
    except CandidateError as error:
        return _error(error)
    return JsonResponse({"conversation": conversation.pk, "title": conversation.title,
                         "url": f"/compare/{conversation.pk}/",
                         "columns": [{"index": index, "label": spec["label"],
                                      "stream_url": f"/compare/{conversation.pk}/columns/{index}/stream/"}
                                     for index, spec in enumerate(conversation.columns)]})


@team_view("compare.send")
@require_POST
def compare_stream(request, conversation_id, column):
    """One column's reply, streamed as NDJSON events, saved when it ends (or when the page goes away)."""
    try:
        conversation = services.conversation_get(team=request.team, user=request.user,
                                                 conversation_id=conversation_id, own=True)
        resolved = services.conversation_column(team=request.team, conversation=conversation, column=column)
        payload = services.conversation_payload(conversation=conversation, column=column)
    except CandidateError as error:
        return _error(error)
    return _stream(_reply_events(conversation.pk, resolved, payload, request.team.pk))


async def _reply_events(conversation_id, column, payload, team_id):
    """Relay the column's events; the reply is saved before the done event goes out (a page that sees "done" can
    ask for the diff at once), or, when the page goes away first, with what had arrived."""
    pieces, recorded = [], False
    try:
        async with aclosing(stream_chat(column, payload, team_id=team_id)) as events:
            async for event in events:
                if event["type"] == "delta":
                    pieces.append(event["text"])
                else:
                    await _reply_record(conversation_id, column, event, pieces)
                    recorded = True
                yield event
    finally:
        if not recorded:
            await _reply_record(conversation_id, column, None, pieces)


async def _reply_record(conversation_id, column, done, pieces):
    metrics = dict(done["metrics"]) if done else {}
    if done is None:
        metrics["error"] = "cancelled: the page was closed before the answer ended"
    elif not done["ok"]:
        metrics["error"] = done["diagnosis"]
    text = done["text"] if done else "".join(pieces)
    await sync_to_async(services.reply_record)(conversation_id=conversation_id, column=column.index, text=text,
                                               metrics=metrics)


def _check_column(request, data):
    spec = candidate_spec(team=request.team, key=data.get("column"), field="column")
    return candidate_resolve(team=request.team, spec=spec, index=0)


@team_view("compare.send")
@require_POST
def compare_json_check(request):
    try:
        data = _body(request)
        column = _check_column(request, data)
        events = checks.json_check_events(
            column, system_prompt=services.system_prompt_clean(data), message=services.message_clean(data),
            sampling=services.sampling_clean(data), repeats=services.repeats_clean(data), team_id=request.team.pk)
    except CandidateError as error:
        return _error(error)
    return _stream(events)


@team_view("compare.send")
@require_POST
def compare_cache_check(request):
    try:
        data = _body(request)
        column = _check_column(request, data)
        events = checks.prefix_cache_check_events(column, system_prompt=services.system_prompt_clean(data),
                                                  team_id=request.team.pk)
    except CandidateError as error:
        return _error(error)
    return _stream(events)


@team_view("compare.send")
@require_POST
def compare_share(request, conversation_id):
    try:
        conversation = services.conversation_get(team=request.team, user=request.user,
                                                 conversation_id=conversation_id)
        services.conversation_share(conversation=conversation, user=request.user,
                                    shared=_body(request).get("shared") is True)
    except CandidateError as error:
        return _error(error)
    return JsonResponse({"conversation": conversation.pk, "shared": conversation.shared})


@team_view("compare.view")
@require_GET
def compare_diff(request, conversation_id):
    """?a=0&b=1&turn=-1: the word diff of two columns' answers to one turn."""
    try:
        conversation = services.conversation_get(team=request.team, user=request.user,
                                                 conversation_id=conversation_id)
        try:
            first, second = int(request.GET.get("a", 0)), int(request.GET.get("b", 1))
            turn = int(request.GET.get("turn", -1))
        except ValueError:
            raise CompareError("a, b and turn must be whole numbers") from None
        result = services.conversation_diff(conversation=conversation, first=first, second=second, turn=turn)
    except CandidateError as error:
        return _error(error)
    return JsonResponse(result)
