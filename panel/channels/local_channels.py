"""Local channels: the channel of each ready deployment replica, kept in step with its state, and the route named
after its served model."""
import logging

from django.db import models, transaction

from panel.accounts.models import Membership
from panel.accounts.roles import may
from panel.channels.models import (
    Channel,
    ChannelApis,
    ChannelKind,
    CredentialKind,
    Route,
    RouteBalance,
    RouteChannel,
    RouteStrategy,
)
from panel.channels.routing import routing_changed
from panel.registry.models import LoraAdapter

log = logging.getLogger(__name__)


def local_channel_sync(deployment):
    """Keep the team's local channel for a deployment in step with it (called by the serving code whenever a
    deployment changes state). Ready: create the channel `local-<profile>` (`local-<profile>-<id>` when that name
    is taken) or take over the one an ended or stopping deployment of the same profile and replica slot left,
    point it at this deployment's base_url and served name, and put it on the route named after the served model
    (created with local_first if missing). Asleep, waking, or starting after a wake: the channel stays as it is (the
    gateway wakes the engine, gateway/waking.py). Any other state: disable the channel linked to this deployment.
    Idempotent.

    Never raises: the supervisor calls it and must not die because of it (errors are logged)."""
    try:
        return _local_channel_sync(deployment)
    except Exception:
        log.exception("local channel sync failed for deployment #%s", getattr(deployment, "pk", None))
        return None


@transaction.atomic
def _local_channel_sync(deployment):
    row = type(deployment).objects.select_related("profile", "team").filter(pk=deployment.pk).first()
    if row is None:
        return None
    if row.sleeping:  # asleep or waking: the channel stays on its route, where a request wakes the engine
        routing_changed(row.team_id)
        return Channel.objects.filter(team=row.team, deployment=row, kind=ChannelKind.LOCAL).first()
    if not row.routable:
        linked = Channel.objects.filter(team=row.team, deployment=row, kind=ChannelKind.LOCAL, enabled=True)
        if linked.update(enabled=False):
            routing_changed(row.team_id)
        return Channel.objects.filter(team=row.team, deployment=row, kind=ChannelKind.LOCAL).first()
    if not row.base_url or not row.served_model_name:
        log.warning("deployment #%s is ready without a base_url or served name; no local channel", row.pk)
        return None
    # A deployment's replicas each have a channel: local-<profile>, then local-<profile>-r2, -r3...
    suffix = f"-r{row.replica_index + 1}" if row.replica_index else ""
    name = f"local-{row.profile.name}"[:100 - len(suffix)] + suffix
    # Its own channel, else the one an ended (or stopping: it never comes back) deployment of the same profile and
    # replica slot left (a relaunch keeps the name and the route). Never a channel found by its name alone: an
    # admin's channel named like a member's profile is not the member's, nor a running deployment's channel.
    ours = Channel.objects.select_for_update().filter(team=row.team, kind=ChannelKind.LOCAL).exclude(
        model_id__in=LoraAdapter.objects.filter(team=row.team).values("served_name"))  # an adapter's: below
    channel = (ours.filter(deployment=row).first()
               or ours.filter(deployment__profile=row.profile_id, deployment__replica_index=row.replica_index,
                              deployment__state__in=(row.STOPPING, *row.FINAL_STATES)).order_by("pk").first())
    if channel is None:
        if Channel.objects.filter(team=row.team, name=name).exists():  # another channel has the name
            name = f"{name[:90]}-{row.pk}"
        channel = Channel(team=row.team, name=name, kind=ChannelKind.LOCAL, credential_kind=CredentialKind.NONE,
                          created_by=row.created_by)
    channel.deployment, channel.base_url, channel.model_id = row, row.base_url.rstrip("/"), row.served_model_name
    channel.enabled, channel.misconfigured = True, ""
    channel.apis = ChannelApis.BOTH  # vLLM serves /v1/messages beside /v1/chat/completions
    if row.engine_key_ciphertext:  # the engine's own key: the same ciphertext, sent only by this channel
        channel.credential_kind, channel.credential_env = CredentialKind.STORED, ""
        channel.credential_ciphertext, channel.credential_last4 = row.engine_key_ciphertext, ""
        channel.misconfigured = channel.credential_problem()
    channel.save()
    head_id = row.replica_of_id or row.pk
    siblings = type(row).objects.filter(models.Q(pk=head_id) | models.Q(replica_of_id=head_id)).exclude(pk=row.pk)
    several = siblings.exists()
    route, created = Route.objects.get_or_create(team=row.team, model_name=row.served_model_name,
                                                 defaults={"strategy": RouteStrategy.LOCAL_FIRST,
                                                           "balance": RouteBalance.PREFIX_AWARE if several
                                                           else RouteBalance.IN_ORDER,
                                                           "created_by": row.created_by})
    # An existing route is the team's: joined only by an admin's choice. An admin attached it at launch; the
    # route is the launcher's own; another replica of this deployment is on it; or an admin (or the operator's
    # `manage.py deploy`) relaunched a profile already on it. A member's relaunch does not inherit an earlier run's
    # place on a route another made: its taken-over channel leaves such routes (an admin adds it back).
    by_admin = _launched_by_admin(row)
    own = models.Q(route__created_by_id=row.created_by_id) if row.created_by_id else models.Q(pk__in=[])
    if not by_admin:
        kept = own
        if row.attach_to_route or route.routechannel_set.filter(channel__deployment__in=siblings).exists():
            kept |= models.Q(route=route)
        RouteChannel.objects.filter(channel=channel).exclude(kept).delete()
    kin = models.Q(channel__deployment__in=siblings)
    if by_admin:
        kin |= models.Q(channel__deployment__profile=row.profile_id)
    joins = (created or row.attach_to_route or (row.created_by_id and route.created_by_id == row.created_by_id)
             or route.routechannel_set.filter(kin).exists())
    if joins and not route.routechannel_set.filter(channel=channel).exists():
        _join(route, channel, kin=lambda other: other.deployment_id is not None and (
            other.deployment.profile_id == row.profile_id or other.deployment.replica_of_id == head_id
            or other.deployment_id == head_id))
    if several and route.balance == RouteBalance.IN_ORDER and route.routechannel_set.filter(
            channel__deployment__in=siblings).exists():
        # In order, the first replica would take every request and the others none: replicas are balanced
        # prefix-aware (a balance the team chose, round-robin or least in flight, stays).
        Route.objects.filter(pk=route.pk).update(balance=RouteBalance.PREFIX_AWARE)
    routing_changed(row.team_id)
    return channel


def adapter_channel_sync(deployment, *, served_name, serving):
    """The local channel of one LoRA adapter a deployment serves ([0098]): the same engine, key and APIs as the
    deployment's own channel, sending `model` = the adapter's served name, on the route of that name (created
    local-first if missing; a route of the team's that exists already is joined only for an admin's launch, as the
    deployment's own). `serving` False switches it off. Runs in the caller's transaction."""
    ours = Channel.objects.select_for_update().filter(team_id=deployment.team_id, kind=ChannelKind.LOCAL,
                                                      model_id=served_name)
    channel = ours.filter(deployment=deployment).first()
    if not serving:
        if channel is not None and channel.enabled:
            Channel.objects.filter(pk=channel.pk).update(enabled=False)
            routing_changed(deployment.team_id)
        return channel
    profile = deployment.profile
    if channel is None:  # the channel an ended deployment of the profile left for this adapter, else a new one
        channel = ours.filter(deployment__profile=profile.pk, deployment__replica_index=deployment.replica_index,
                              deployment__state__in=(deployment.STOPPING, *deployment.FINAL_STATES)).first()
    if channel is None:
        suffix = f"-r{deployment.replica_index + 1}" if deployment.replica_index else ""
        name = f"local-{profile.name}-{served_name}"[:100 - len(suffix)] + suffix
        if Channel.objects.filter(team_id=deployment.team_id, name=name).exists():
            name = f"{name[:90]}-{deployment.pk}"
        channel = Channel(team_id=deployment.team_id, name=name, kind=ChannelKind.LOCAL,
                          credential_kind=CredentialKind.NONE, created_by_id=deployment.created_by_id)
    channel.deployment, channel.base_url, channel.model_id = deployment, deployment.base_url.rstrip("/"), served_name
    channel.enabled, channel.misconfigured, channel.apis = True, "", ChannelApis.BOTH
    if deployment.engine_key_ciphertext:
        channel.credential_kind, channel.credential_env = CredentialKind.STORED, ""
        channel.credential_ciphertext, channel.credential_last4 = deployment.engine_key_ciphertext, ""
        channel.misconfigured = channel.credential_problem()
    channel.save()
    route, created = Route.objects.get_or_create(team_id=deployment.team_id, model_name=served_name,
                                                 defaults={"strategy": RouteStrategy.LOCAL_FIRST,
                                                           "created_by_id": deployment.created_by_id})
    joins = created or _launched_by_admin(deployment) or (
        deployment.created_by_id and route.created_by_id == deployment.created_by_id)
    if joins and not route.routechannel_set.filter(channel=channel).exists():
        _join(route, channel, kin=lambda other: other.deployment_id is not None
              and other.deployment.profile_id == profile.pk)
    routing_changed(deployment.team_id)
    return channel


def _launched_by_admin(deployment):
    """True when whoever launched the deployment may put it on the team's routes: an admin of its team, or nobody
    known (the operator's `manage.py deploy`)."""
    if deployment.created_by_id is None:
        return True
    membership = Membership.objects.filter(team_id=deployment.team_id, user_id=deployment.created_by_id).first()
    return membership is not None and may(membership, "routes.edit")


def _join(route, channel, *, kin):
    """Put a local channel on the route right after its kin (`kin(channel)`: a channel of another replica of the same
    deployment, or of a deployment of the same profile), so that a cloud fallback after them stays after them; with
    no kin on the route, last (the team's order stands). The entries after it move one place down."""
    entries = list(route.routechannel_set.select_related("channel__deployment").order_by("position", "pk"))
    kin_at = [index for index, entry in enumerate(entries) if kin(entry.channel)]
    at = kin_at[-1] + 1 if kin_at else len(entries)
    for index, entry in enumerate(entries):
        wanted = index if index < at else index + 1
        if entry.position != wanted:
            RouteChannel.objects.filter(pk=entry.pk).update(position=wanted)
    RouteChannel.objects.create(route=route, channel=channel, position=at)
