"""Why a replica's prefix-cache hit rate is low, on the Cache tab: the workload (few requests open like an earlier
one), the routing (requests that open like an earlier one went to another replica than that one: the prefix was
cached elsewhere), or evictions (its KV cache was full: the engine's own KV usage gauge at its peak and its
preemptions, as scraped).

"Open like an earlier one": the same first 1,024 characters of the prompt as the model reads it, or the same system
prompt (the gateway's keyed hashes in the usage rows, gateway/fingerprint.py). The first catches shared text wherever
it sits, a document opening the user turn included; the second a short system prompt followed by varied turns.

The usage rows are read one by one, the newest SCAN_LIMIT of the range, as the failures table reads them."""
from panel.channels.models import Channel
from panel.dashboards.requests import SCAN_LIMIT, rows_in
from panel.dashboards.tables import Table

LOW_HIT_RATE = 0.5  # under this, the row says why
FEW_SHARED = 0.5  # fewer requests than this share a prefix with an earlier one: the workload
SENT_AWAY = 0.25  # more repeats than this went to another replica than the previous one: the routing
FULL_KV = 0.9  # a peak KV cache usage at or past this (or any preemption): evictions


def prefix_sharing(query):
    """Per deployment (replica): {"requests": with a prompt, "repeats": that open like an earlier request of the
    range, "sent_away": of those, sent to another replica than that earlier one}."""
    rows = rows_in(query).filter(channel__deployment__isnull=False).exclude(prompt_head_hash="",
                                                                             system_prompt_hash="")
    rows = list(rows.order_by("-created_at").values_list("prompt_head_hash", "system_prompt_hash", "channel_id")
                [:SCAN_LIMIT])
    deployment_of = dict(Channel.objects.filter(pk__in={channel for *_, channel in rows})
                         .values_list("pk", "deployment_id"))
    last_replica, sharing = {}, {}
    for head, system, channel_id in reversed(rows):
        replica = deployment_of.get(channel_id)
        counts = sharing.setdefault(replica, {"requests": 0, "repeats": 0, "sent_away": 0})
        counts["requests"] += 1
        keys = [key for key in (("head", head), ("system", system)) if key[1]]
        before = next((last_replica[key] for key in keys if key in last_replica), None)  # the longer match first
        if before is not None:
            counts["repeats"] += 1
            counts["sent_away"] += before != replica
        for key in keys:
            last_replica[key] = replica
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
        found.append("routing: requests sharing a prefix went to different replicas")
    if requests and repeats / requests < FEW_SHARED:
        found.append("workload: few requests share a prefix with an earlier one")
    return "; ".join(found) or "none of these (short shared prefixes)"


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
        "deployment", "hit rate %", "requests", "sharing a prefix with an earlier one %",
        "of those, sent to another replica %", "peak KV usage %", "preempted", "likely cause"], rows,
        note="A request shares a prefix with an earlier one when its prompt opens with the same 1,024 characters "
             "(a system prompt, tools, or a document opening the user turn) or has the same system prompt; the "
             "gateway keeps keyed hashes of these, never the text. Workload: few requests share a prefix. Routing: "
             "requests sharing a prefix went to another replica than the earlier one, whose cache held it (balance "
             "the route by KV events, or prefix-aware when the shared text is the system prompt). Evictions: the "
             f"KV cache was full (peak usage {round(100 * FULL_KV)}% or more, or requests preempted).")


def _pct(value):
    return None if value is None else round(100 * value, 1)
