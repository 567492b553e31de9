"""Channels (as on Channels): list, one, create, change, delete, Test, credential rotation, and settings.json import
and export in its two formats (A and B). A stored key is write-only: answers show its last four characters."""
import datetime
import json
from typing import Any, Literal

from django.shortcuts import get_object_or_404
from ninja import Field, Query, Router, Schema, Status

from panel.api.auth import gate
from panel.api.errors import Invalid, errors
from panel.api.form_bodies import schema_from_form, validated
from panel.api.schemas import Money
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.channels import settings_json
from panel.channels.forms import ChannelForm, ImportForm
from panel.channels.models import Channel, CredentialKind, Route, listed_channels
from panel.channels.services import (
    channel_create,
    channel_delete,
    channel_test,
    channel_update,
)
from panel.channels.settings_export import export_a, export_b

router = Router(tags=["channels"])


class ChannelOut(Schema):
    id: int
    name: str
    kind: str
    deployment_id: int | None
    base_url: str
    model_id: str
    apis: str = Field(description="What the upstream speaks: chat (OpenAI chat completions and the Responses API), "
                                  "chat_only (chat completions only: Responses requests are translated to it), "
                                  "messages (Anthropic Messages) or both (all three, as a local vLLM).")
    credential_kind: str
    credential_env: str
    credential: str = Field(description="How the key is provided, with a stored key's last four characters only.")
    connect_timeout_seconds: float
    first_byte_timeout_seconds: float
    idle_timeout_seconds: float
    timeout_seconds: float
    max_retries: int
    retry_backoff: float
    priority: int
    weight: int
    price_input_per_million: Money
    price_output_per_million: Money
    price_cached_per_million: Money
    price_cache_write_per_million: Money | None
    price_tool_calls_per_thousand: Money
    enabled: bool
    scrape_urls: list[str] = Field(description="A vLLM pool's /metrics URLs, one per engine (empty for other kinds).")
    scrape_token: str = Field(description="A vLLM pool's stored bearer token for its /metrics, as its last four "
                                          "characters only; empty when none is stored.")
    gpu_count: int = Field(description="A vLLM pool's GPUs (0 for other kinds).")
    price_per_gpu_hour: Money | None = Field(description="What one of a vLLM pool's GPUs costs an hour.")
    batch_slots: int | None = Field(description="The requests a vLLM pool's engines run at once (for spilling).")
    misconfigured: str
    warnings: list[str] = []
    last_test: dict[str, Any] | None
    last_tested_at: datetime.datetime | None


ChannelCreate = schema_from_form(ChannelForm, "ChannelCreate")
ChannelChange = schema_from_form(ChannelForm, "ChannelChange", partial=True)


class CredentialRotate(Schema):
    api_key: str = Field(..., min_length=1, max_length=600, description="The new key, stored encrypted.")


class SettingsImport(Schema):
    text: str = Field(..., max_length=settings_json.MAX_BYTES, description="settings.json, format A or B.")
    replace: bool = Field(False, description="Replace channels and the route that have the same names.")


class SettingsImported(Schema):
    format: str
    channels: list[str]
    route: str
    warnings: list[str]


def channel_out(channel):
    out = {name: getattr(channel, name) for name in ChannelOut.model_fields
           if name not in ("credential", "warnings", "last_test", "scrape_urls", "scrape_token")}
    out.update(credential=channel.credential_display, warnings=list(getattr(channel, "warnings", [])),
               last_test=channel.last_test or None, misconfigured=channel.problem,
               scrape_urls=channel.scrape_url_list(),
               scrape_token=f"••••{channel.scrape_token_last4}" if channel.scrape_token_ciphertext else "")
    return out


def _channel(request, channel_id):
    return get_object_or_404(Channel.objects.filter(team=request.team).select_related("deployment"), pk=channel_id)


def _credential_audit(request, channel, before, api_key, created=False):
    if created or api_key or before != (channel.credential_kind, channel.credential_env, channel.credential_last4):
        audit_record(action=AuditAction.CREDENTIAL_CHANGED, request=request, target=channel.name,
                     credential=channel.credential_kind, **({"created": True} if created else {}))


@router.get("/channels", auth=gate("channels.view"), response=errors({200: list[ChannelOut]}))
def channels_list(request):
    return [channel_out(channel) for channel in listed_channels(request.team).order_by("name")]


@router.get("/channels/{channel_id}", auth=gate("channels.view"), response=errors({200: ChannelOut}))
def channels_get(request, channel_id: int):
    return channel_out(_channel(request, channel_id))


@router.post("/channels", auth=gate("channels.edit"), response=errors({201: ChannelOut}))
def channels_create(request, body: ChannelCreate):
    form = validated(ChannelForm, body, team=request.team)
    channel = channel_create(team=request.team, user=request.user, api_key=form.cleaned_data["api_key"],
                             **form.channel_fields())
    _credential_audit(request, channel, None, form.cleaned_data["api_key"], created=True)
    return Status(201, channel_out(channel))


@router.patch("/channels/{channel_id}", auth=gate("channels.edit"), response=errors({200: ChannelOut}),
              summary="Change a channel (fields not sent keep their values; an empty api_key keeps the stored key)")
def channels_change(request, channel_id: int, body: ChannelChange):
    channel = _channel(request, channel_id)
    before = (channel.credential_kind, channel.credential_env, channel.credential_last4)
    form = validated(ChannelForm, body, team=request.team, instance=channel)
    channel = channel_update(channel=channel, api_key=form.cleaned_data["api_key"], **form.channel_fields())
    _credential_audit(request, channel, before, form.cleaned_data["api_key"])
    if channel.changes:
        audit_record(action=AuditAction.CHANNEL_CHANGED, request=request, target=channel.name,
                     **{name: f"{old} → {new}" for name, (old, new) in channel.changes.items()})
    return channel_out(channel)


@router.post("/channels/{channel_id}/credential", auth=gate("channels.edit"), response=errors({200: ChannelOut}),
             summary="Rotate the channel's key: store a new one, encrypted (the channel's credential becomes stored)")
def channels_rotate(request, channel_id: int, body: CredentialRotate):
    channel = _channel(request, channel_id)
    form = validated(ChannelForm, {"credential_kind": CredentialKind.STORED, "api_key": body.api_key},
                     team=request.team, instance=channel)
    channel = channel_update(channel=channel, api_key=form.cleaned_data["api_key"], **form.channel_fields())
    _credential_audit(request, channel, None, body.api_key)
    return channel_out(channel)


@router.post("/channels/{channel_id}/test", auth=gate("channels.test"), response=errors({200: dict[str, Any]}),
             summary="The Test button: GET /models, then a one-token chat (its result is stored on the channel)")
def channels_test(request, channel_id: int):
    return channel_test(_channel(request, channel_id))


@router.delete("/channels/{channel_id}", auth=gate("channels.edit"), response=errors({204: None}))
def channels_delete(request, channel_id: int):
    channel_delete(channel=_channel(request, channel_id))
    return Status(204, None)


class ExportQuery(Schema):
    format: Literal["a", "b"] = "b"
    route: int | None = Field(None, ge=1, le=2**53)


@router.get("/settings.json", auth=gate("settings.export"), response=errors({200: dict[str, Any]}),
            summary="Export settings.json: format B (every channel, or a route's), or format A (one route)")
def settings_export(request, query: Query[ExportQuery]):
    route = None
    if query.route is not None:
        route = get_object_or_404(Route, pk=query.route, team=request.team)
    if query.format == "a":
        if route is None:
            raise Invalid({"route": ["Format A describes one route: pick the route to export."]})
        return json.loads(export_a(route=route))
    return json.loads(export_b(team=request.team, route=route))


@router.post("/settings.json", auth=gate("settings.import"), response=errors({201: SettingsImported}),
             summary="Import settings.json (everything or nothing)")
def settings_import(request, body: SettingsImport):
    form = validated(ImportForm, {"text": body.text, "replace": body.replace})
    result = settings_json.settings_import(team=request.team, user=request.user, text=form.cleaned_data["payload"],
                                           replace=form.cleaned_data["replace"])
    return Status(201, {"format": result.format, "channels": [channel.name for channel in result.channels],
                 "route": result.route.model_name, "warnings": list(result.warnings)})


