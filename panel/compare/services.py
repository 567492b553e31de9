"""Compare: which columns a team may use, the checks on what a user sends, saved conversations and their
per-column history, and the word diff of two answers. The streaming itself is in relay.py and checks.py."""
import difflib
import math
import re

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from panel.channels.models import Channel, ChannelKind, Route
from panel.compare.models import Conversation, Message, MessageRole
from panel.gateway.panel_requests import CandidateError, candidate_resolve, candidate_spec

MIN_COLUMNS, MAX_COLUMNS = 2, 4
MAX_MESSAGE_CHARS = 32_000
MAX_SYSTEM_CHARS = 64_000
MAX_JSON_REPEATS = 50


class CompareError(CandidateError):
    """Input the page must refuse, with the sentence it shows. `status` 400 (bad input) or 404 (not yours). A column
    that is no candidate raises the CandidateError it is a kind of."""


def column_choices(*, team):
    """Every enabled channel and route of the team, as the page's column picker lists them."""
    choices = [{"key": f"channel:{channel.pk}", "kind": "channel", "id": channel.pk,
                "label": f"{channel.name} · {channel.model_id}", "local": channel.is_local}
               for channel in Channel.objects.filter(team=team, enabled=True).order_by("kind", "priority", "name")]
    choices += [{"key": f"route:{route.pk}", "kind": "route", "id": route.pk,
                 "label": f"route {route.model_name}", "local": False}
                for route in Route.objects.filter(team=team, enabled=True)]
    return choices


def columns_default(*, team):
    """The team's local deployment channel next to its TaoToken (else any remote) channel, as far as they exist."""
    channels = list(Channel.objects.filter(team=team, enabled=True).order_by("priority", "name"))
    local = next((c for c in channels if c.kind == ChannelKind.LOCAL and c.deployment_id), None) or next(
        (c for c in channels if c.kind == ChannelKind.LOCAL), None)
    remotes = [c for c in channels if c.kind == ChannelKind.REMOTE]
    remote = next((c for c in remotes if "taotoken" in (c.name + c.base_url).lower()), None) or next(
        iter(remotes), None)
    keys = [f"channel:{c.pk}" for c in (local, remote) if c is not None]
    for channel in channels:  # fill up to two columns with whatever else the team has
        if len(keys) >= MIN_COLUMNS:
            break
        if f"channel:{channel.pk}" not in keys:
            keys.append(f"channel:{channel.pk}")
    return keys


def columns_parse(*, team, keys):
    """["channel:3", "route:5"] -> column specs [{"kind", "id", "label"}]. Another team's channel is a 404."""
    if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys):
        raise CompareError("columns must be a list like [\"channel:3\", \"route:5\"]", field="columns")
    if not MIN_COLUMNS <= len(keys) <= MAX_COLUMNS:
        raise CompareError(f"pick {MIN_COLUMNS} to {MAX_COLUMNS} columns (you picked {len(keys)})", field="columns")
    if len(set(keys)) != len(keys):
        raise CompareError("the same channel or route is picked twice", field="columns")
    return [candidate_spec(team=team, key=key) for key in keys]


def _number(data, name, default, *, low, high, whole=False):
    value = data.get(name, default)
    if value in (None, ""):
        value = default
    try:
        number = int(value) if whole and not isinstance(value, float) else float(value)
    except (TypeError, ValueError):
        raise CompareError(f"{name} must be a number", field=name) from None
    if isinstance(value, bool) or not math.isfinite(number) or (whole and number != int(number)):
        raise CompareError(f"{name} must be a {'whole ' if whole else ''}number", field=name)
    if not low <= number <= high:
        raise CompareError(f"{name} must be from {low:g} to {high:g} (got {number:g})", field=name)
    return int(number) if whole else number


def sampling_clean(data):
    """temperature, top_p and max_tokens from what the page sent, or CompareError naming the field."""
    return {"temperature": _number(data, "temperature", 0.7, low=0, high=2),
            "top_p": _number(data, "top_p", 1.0, low=0.01, high=1),
            "max_tokens": _number(data, "max_tokens", 256, low=1, high=settings.GATEWAY_MAX_TOKENS, whole=True)}


def message_clean(data, *, required=True):
    message = data.get("message", "")
    if not isinstance(message, str):
        raise CompareError("the message must be text", field="message")
    message = message.strip()
    if required and not message:
        raise CompareError("type a message first: an empty message is not sent", field="message")
    if len(message) > MAX_MESSAGE_CHARS:
        raise CompareError(f"the message is longer than {MAX_MESSAGE_CHARS} characters", field="message")
    return message


def system_prompt_clean(data):
    system = data.get("system_prompt", "")
    if not isinstance(system, str):
        raise CompareError("the system prompt must be text", field="system_prompt")
    if len(system) > MAX_SYSTEM_CHARS:
        raise CompareError(f"the system prompt is longer than {MAX_SYSTEM_CHARS} characters", field="system_prompt")
    return system.strip()


def repeats_clean(data):
    return _number(data, "repeats", 10, low=1, high=MAX_JSON_REPEATS, whole=True)


def conversations_visible(*, team, user):
    """The user's own conversations and those shared with the team, newest first."""
    return Conversation.objects.filter(team=team).filter(Q(owner=user) | Q(shared=True)).select_related("owner")


def conversation_get(*, team, user, conversation_id, own=False):
    """A conversation the user may read (own=True: may write to); another's unshared one is a 404."""
    found = conversations_visible(team=team, user=user).filter(pk=conversation_id).first()
    if found is None or (own and found.owner_id != user.pk):
        raise CompareError("no such conversation" + (" of yours" if found is not None else ""), status=404)
    return found


@transaction.atomic
def conversation_send(*, team, user, conversation_id=None, column_keys=None, system_prompt="", message,
                      temperature, top_p, max_tokens):
    """Start a conversation (columns, system prompt) or continue one of the user's own; either way the user's
    message is added to every column's history. The replies are streamed per column afterwards."""
    if conversation_id:
        conversation = conversation_get(team=team, user=user, conversation_id=conversation_id, own=True)
        Conversation.objects.filter(pk=conversation.pk).update(temperature=temperature, top_p=top_p,
                                                               max_tokens=max_tokens, updated_at=timezone.now())
        conversation.refresh_from_db()
    else:
        specs = columns_parse(team=team, keys=column_keys)
        title = " ".join(message.split())[:80] or "Untitled"
        conversation = Conversation.objects.create(team=team, owner=user, title=title, columns=specs,
                                                   system_prompt=system_prompt, temperature=temperature,
                                                   top_p=top_p, max_tokens=max_tokens)
    Message.objects.bulk_create([Message(conversation=conversation, column=index, role=MessageRole.USER,
                                         content=message) for index in range(len(conversation.columns))])
    return conversation


def conversation_column(*, team, conversation, column):
    if not isinstance(column, int) or not 0 <= column < len(conversation.columns):
        raise CompareError(f"this conversation has no column {column}", status=404)
    return candidate_resolve(team=team, spec=conversation.columns[column], index=column)


def conversation_history(*, conversation, column):
    """The messages to send for the column's next reply: the system prompt, then earlier turns whose reply
    succeeded, then the pending user message. A turn whose reply failed is left out (the model never saw it)."""
    rows = list(conversation.messages.filter(column=column).order_by("pk"))
    history = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
    pending = None
    for row in rows:
        if row.role == MessageRole.USER:
            pending = row
        elif pending is not None:
            if not row.failed:
                history += [{"role": "user", "content": pending.content},
                            {"role": "assistant", "content": row.content}]
            pending = None
    if pending is None:
        raise CompareError("this column has no message waiting for a reply: send one first", status=409)
    history.append({"role": "user", "content": pending.content})
    return history


def conversation_payload(*, conversation, column):
    return {"messages": conversation_history(conversation=conversation, column=column),
            "temperature": conversation.temperature, "top_p": conversation.top_p,
            "max_tokens": conversation.max_tokens}


def reply_record(*, conversation_id, column, text, metrics):
    """Save one column's reply (or its failure, in metrics["error"])."""
    Message.objects.create(conversation_id=conversation_id, column=column, role=MessageRole.ASSISTANT,
                           content=text, metrics=metrics)
    Conversation.objects.filter(pk=conversation_id).update(updated_at=timezone.now())


def conversation_share(*, conversation, user, shared):
    if conversation.owner_id != user.pk:
        raise CompareError("only its owner can share or unshare a conversation", status=403)
    Conversation.objects.filter(pk=conversation.pk).update(shared=bool(shared))
    conversation.shared = bool(shared)
    return conversation


def conversation_columns(conversation):
    """The saved conversation as the page draws it: per column, its messages in order."""
    columns = [{"index": index, "label": spec["label"], "key": f"{spec['kind']}:{spec['id']}", "messages": []}
               for index, spec in enumerate(conversation.columns)]
    for row in conversation.messages.order_by("pk"):
        if row.column < len(columns):
            columns[row.column]["messages"].append({"role": row.role, "content": row.content,
                                                    "metrics": row.metrics})
    return columns


def texts_diff(first, second):
    """A word-level diff: [[op, text], ...] with op equal, delete (only in the first) or insert (only in the
    second). Whitespace stays attached to the words so the pieces join back into each text."""
    a, b = re.findall(r"\s*\S+|\s+", first), re.findall(r"\s*\S+|\s+", second)
    pieces = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            pieces.append(["equal", "".join(a[i1:i2])])
            continue
        if i2 > i1:
            pieces.append(["delete", "".join(a[i1:i2])])
        if j2 > j1:
            pieces.append(["insert", "".join(b[j1:j2])])
    return pieces


def conversation_diff(*, conversation, first, second, turn):
    """The diff of two columns' answers to the same turn (turn -1: the latest)."""
    if first == second or not all(0 <= c < len(conversation.columns) for c in (first, second)):
        raise CompareError(f"pick two different columns from 0 to {len(conversation.columns) - 1}")
    answers = []
    for column in (first, second):
        replies = list(conversation.messages.filter(column=column, role=MessageRole.ASSISTANT).order_by("pk"))
        try:
            answers.append(replies[turn])
        except IndexError:
            raise CompareError(f"column {column} has no answer number {turn}") from None
    return {"first": conversation.columns[first]["label"], "second": conversation.columns[second]["label"],
            "pieces": texts_diff(answers[0].content, answers[1].content),
            "ratio": round(difflib.SequenceMatcher(None, answers[0].content, answers[1].content).ratio(), 3)}
