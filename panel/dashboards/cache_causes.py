"""Why a replica's prefix-cache hit rate is low, on the Cache tab: the workload (few requests share a system prompt
with an earlier one: the gateway's keyed hashes of system prompts in the usage rows), the routing (requests whose
system prompt an earlier request had went to another replica than that one: the prefix was cached elsewhere), or
evictions (its KV cache was full: the engine's own KV usage gauge at its peak and its preemptions, as scraped).

The usage rows are read one by one, the newest SCAN_LIMIT of the range, as the failures table reads them."""
from panel.channels.models import Channel
from panel.dashboards.requests import SCAN_LIMIT, rows_in
from panel.dashboards.tables import Table

LOW_HIT_RATE = 0.5  # under this, the row says why
FEW_SHARED = 0.5  # fewer requests than this share a system prompt with an earlier one: the workload
SENT_AWAY = 0.25  # more repeats than this went to another replica than the previous one: the routing
FULL_KV = 0.9  # a peak KV cache usage at or past this (or any preemption): evictions


def prefix_sharing(query):
    """Per deployment (replica): {"requests": with a system prompt, "repeats": whose system prompt an earlier
    request of the range had, "sent_away": of those, sent to another replica than the previous one}."""
    rows = rows_in(query).exclude(system_prompt_hash="").filter(channel__deployment__isnull=False)
    rows = list(rows.order_by("-created_at").values_list("system_prompt_hash", "channel_id")[:SCAN_LIMIT])
    deployment_of = dict(Channel.objects.filter(pk__in={channel for _, channel in rows})
                         .values_list("pk", "deployment_id"))
    last_replica, sharing = {}, {}
    for prompt_hash, channel_id in reversed(rows):
        replica = deployment_of.get(channel_id)
        counts = sharing.setdefault(replica, {"requests": 0, "repeats": 0, "sent_away": 0})
        counts["requests"] += 1
        before = last_replica.get(prompt_hash)
        if before is not None:
            counts["repeats"] += 1
            counts["sent_away"] += before != replica
        last_replica[prompt_hash] = replica
    return sharing


def causes(hit_rate, sharing, kv_max, preemptions):
    """The likely causes of a low hit rate, in words ("" when the rate is not low)."""
    if hit_rate is None:
        return "no prefix-cache lookups"
    if hit_rate >= LOW_HIT_RATE:
        return "not low"
    found = []
    if (kv_max is not None and kv_max >= FULL_KV) or preemptions:
        found.append(f"evictions: its KV cache was full (peak {round(100 * (kv_max or 0))}%, "
                     f"{int(preemptions)} preempted)")
    requests, repeats = sharing.get("requests", 0), sharing.get("repeats", 0)
    if repeats and sharing.get("sent_away", 0) / repeats > SENT_AWAY:
        found.append("routing: requests sharing a system prompt went to different replicas")
    if requests and repeats / requests < FEW_SHARED:
        found.append("workload: few requests share a system prompt with an earlier one")
    return "; ".join(found) or "none of these (short prompts, or prefixes other than the system prompt)"


def causes_table(query, engine_totals, engine_names):
    """One row per deployment: its hit rate, how much of its traffic shares a prefix, how much of that was sent to
    another replica, its KV cache's peak and preemptions, and the likely cause."""
    sharing = prefix_sharing(query)
    rows = []
    for total in engine_totals:
        if total["deployment_id"] is None:  # a vLLM pool: its requests' replica is not known
            continue
        counts = sharing.get(total["deployment_id"], {})
        requests, repeats = counts.get("requests", 0), counts.get("repeats", 0)
        rows.append([engine_names.get(total["source"], "?"), _pct(total["hit_rate"]), requests,
                     _pct(repeats / requests if requests else None),
                     _pct(counts.get("sent_away", 0) / repeats if repeats else None), _pct(total["kv_max"]),
                     int(total["preemptions"]),
                     causes(total["hit_rate"], counts, total["kv_max"], total["preemptions"])])
    return Table("cache_causes", "Why a replica's prefix-cache hit rate is low", [
        "deployment", "hit rate %", "requests with a system prompt", "sharing an earlier one's %",
        "of those, sent to another replica %", "peak KV usage %", "preempted", "likely cause"], rows,
        note="Workload: few requests share a system prompt with an earlier one (the gateway's hashes of system "
             "prompts). Routing: requests whose system prompt an earlier one had went to another replica than that "
             "one, whose cache held it (balance the route prefix-aware or by KV events). Evictions: the KV cache "
             f"was full (peak usage {round(100 * FULL_KV)}% or more, or requests preempted). Shared prefixes other "
             "than the system prompt (a document in the first user turn) are not counted here.")


def _pct(value):
    return None if value is None else round(100 * value, 1)
