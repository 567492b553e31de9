"""settings.json out, in both shapes (panel/channels/settings_json.py reads them back in). Export never writes a
stored secret: a stored key becomes a `${TOKENWISE_UPSTREAM_<CHANNEL>}` placeholder, and `_note` says so (the
importer accepts `_note`). Format B also carries a vLLM pool's own fields (`pool`), but never its scrape token."""
import json
import re

from django.core.exceptions import ValidationError

from panel.channels.credential_env import display_origin
from panel.channels.models import EMPTY_KEY, Channel, ChannelKind, CredentialKind, RouteStrategy
from panel.env import url_origin


def placeholder_env(channel):
    return "TOKENWISE_UPSTREAM_" + re.sub(r"[^A-Za-z0-9]", "_", channel.name).upper()


def placeholder_note(channel, name):
    """What to do where the file is used: a Tokenwise there sends the variable only where its operator binds it."""
    origin = url_origin(channel.base_url)
    return (f"{channel.name}: its key is stored encrypted in Tokenwise and is not exported; set {name} where this file "
            f"is used (in Tokenwise, bound to {display_origin(origin) if origin else 'its server'} in "
            "TOKENWISE_CREDENTIAL_ENV_BINDINGS).")


def _key_b(channel, notes):
    if channel.credential_kind == CredentialKind.ENV:
        return f"${{{channel.credential_env}}}"
    if channel.credential_kind == CredentialKind.STORED:
        name = placeholder_env(channel)
        notes.append(placeholder_note(channel, name))
        return f"${{{name}}}"
    return EMPTY_KEY


def _number(value):
    value = float(value)
    return int(value) if value.is_integer() else value


def _route_entries(route):
    entries = route.entries()
    if route.strategy == RouteStrategy.LOCAL_FIRST:
        entries.sort(key=lambda entry: 0 if entry.channel.kind == ChannelKind.LOCAL else 1)
    return [entry.channel for entry in entries]


def _channel_b(channel, notes):
    entry = {"base_url": channel.base_url, "api_key": _key_b(channel, notes), "model_id": channel.model_id}
    if channel.is_pool:
        price = channel.price_per_gpu_hour
        entry["pool"] = {"scrape_urls": channel.scrape_url_list(), "gpu_count": channel.gpu_count,
                         "price_per_gpu_hour": None if price is None else _number(price),
                         "batch_slots": channel.batch_slots}
        if channel.scrape_token_ciphertext:
            notes.append(f"{channel.name}: its scrape token is stored encrypted in Tokenwise and is not exported; "
                         "type it on the channel's page where this file is imported.")
    return entry


def export_b(*, team, route=None):
    """Format B text: the route's channels (default channel first) or, without a route, every channel."""
    channels = _route_entries(route) if route is not None else sorted(
        Channel.objects.filter(team=team), key=lambda channel: (channel.kind != ChannelKind.LOCAL, channel.priority,
                                                                channel.name))
    if not channels:
        raise ValidationError("Nothing to export: add a channel first.")
    notes = []
    document = {"channels": {channel.name: _channel_b(channel, notes) for channel in channels},
                "default_channel": channels[0].name}
    if notes:
        document["_note"] = " ".join(notes)
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def export_a(*, route):
    """Format A text for a route: its first local channel as local_vllm, its first remote one as cloud_fallback."""
    channels = _route_entries(route)
    local = next((channel for channel in channels if channel.kind == ChannelKind.LOCAL), None)
    remote = next((channel for channel in channels if channel.kind == ChannelKind.REMOTE), None)
    if local is None and remote is None:
        raise ValidationError("Nothing to export: the route has no channel.")
    notes, document = [], {}
    if remote is not None:
        document["provider"] = remote.name
        document["base_url"] = re.sub(r"/v1$", "", remote.base_url)
        if remote.credential_kind == CredentialKind.ENV:
            document["api_key_env"] = remote.credential_env
        elif remote.credential_kind == CredentialKind.STORED:
            document["api_key_env"] = placeholder_env(remote)
            notes.append(placeholder_note(remote, document["api_key_env"]))
        else:
            document["api_key_env"] = ""
    source = remote or local
    document["default_model"] = route.model_name
    document["timeout_seconds"] = _number(source.timeout_seconds)
    document["max_retries"] = source.max_retries
    document["retry_backoff"] = _number(source.retry_backoff)
    document["endpoints"] = {}
    if local is not None:
        document["endpoints"]["local_vllm"] = local.base_url
    if remote is not None:
        document["endpoints"]["cloud_fallback"] = remote.base_url
    document["routing"] = {"strategy": route.strategy, "fallback_on_error": route.fallback_on_error}
    different = [channel for channel in (local, remote) if channel is not None
                 and channel.model_id != route.model_name]
    if different:
        notes.append("Format A has one model name for every endpoint; the channels' own model ids ("
                     + ", ".join(f"{channel.name}: {channel.model_id}" for channel in different) + ") are not in it.")
    left_out = [channel.name for channel in channels if channel not in (local, remote)]
    if left_out:
        notes.append("Format A holds one local and one cloud endpoint; not in this file: " + ", ".join(left_out)
                     + " (export format B for every channel).")
    if notes:
        document["_note"] = " ".join(notes)
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"
