"""Synthetic usage for demos and the benchmark: `manage.py seed_usage N` writes N realistic usage records spread
over the last 30 days for one team, with a local deployment (on a host with a GPU price) and two cloud channels."""
import math
import random
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from django.db import transaction

from panel.accounts.models import TeamKey
from panel.channels.models import Channel
from panel.hosts.models import WorkerHost
from panel.registry.models import RegisteredModel
from panel.serving.models import Deployment, DeploymentState, ServingProfile
from panel.usage.models import RequestLog

DAYS = 30
BATCH = 5000
LOCAL_MODEL = "qwen2.5-14b-awq"
CLOUD = (("taotoken-qwen", "qwen2.5-14b-instruct", "0.8", "2.4", "0.2"),
         ("taotoken-deepseek", "deepseek-v3", "2.0", "8.0", "0.5"))


def usage_seed_fixtures(*, team):
    """The channels, keys and local deployment the records point at (created once, reused after)."""
    now = datetime.now(timezone.utc)
    host, _ = WorkerHost.objects.get_or_create(
        name="gpu@seed-demo-host", defaults={"host": "seed-demo-host", "kind": "gpu", "cpu_count": 32,
                                             "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3",
                                                       "memory_bytes": 85899345920}],
                                             "gpu_price_per_hour": Decimal("2.50"), "gpu_count": 1})
    model, _ = RegisteredModel.objects.get_or_create(
        team=team, name="seed-qwen2.5-14b-awq", defaults={
            "path": "/models/qwen2.5-14b-awq", "architecture": "Qwen2ForCausalLM", "model_type": "qwen2",
            "parameter_count": 14_770_000_000, "linear_parameter_count": 13_000_000_000, "num_layers": 48,
            "num_attention_heads": 40, "num_kv_heads": 8, "hidden_size": 5120, "head_dim": 128,
            "max_position_embeddings": 32768, "dtype": "float16", "size_bytes": 9_000_000_000})
    profile, _ = ServingProfile.objects.get_or_create(team=team, name="seed-14b-awq", defaults={
        "model": model, "served_model_name": LOCAL_MODEL})
    deployment = Deployment.objects.filter(team=team, profile=profile).first()
    if deployment is None:
        deployment = Deployment.objects.create(team=team, profile=profile, host=host, state=DeploymentState.STOPPED,
                                               served_model_name=LOCAL_MODEL, gpu_indices=[0],
                                               base_url="http://seed-demo-host:8000/v1",
                                               ready_at=now - timedelta(days=DAYS), finished_at=now)
    local, _ = Channel.objects.get_or_create(team=team, name="seed-local-14b", defaults={
        "kind": "local", "deployment": deployment, "base_url": deployment.base_url, "model_id": LOCAL_MODEL,
        "enabled": False})
    clouds = []
    for name, model_id, price_in, price_out, price_cached in CLOUD:
        channel, _ = Channel.objects.get_or_create(team=team, name=name, defaults={
            "kind": "remote", "base_url": "https://taotoken.net/api/v1", "model_id": model_id, "enabled": False,
            "price_input_per_million": Decimal(price_in), "price_output_per_million": Decimal(price_out),
            "price_cached_per_million": Decimal(price_cached)})
        clouds.append(channel)
    keys = []
    for name in ("web-app", "batch-jobs", "agent", "support-bot", "analytics"):
        key = TeamKey.objects.filter(team=team, name=f"seed-{name}").first()
        if key is None:
            # A hash no key has, and revoked: the seeded keys can never be used.
            key = TeamKey.objects.create(team=team, name=f"seed-{name}", last4="seed", revoked_at=now,
                                         key_hash=f"seed-{team.pk}-{name}".ljust(64, "0")[:64])
        keys.append(key)
    return local, clouds, keys


def usage_seed(*, team, count, seed=1, days=DAYS, on_progress=None):
    """Write `count` RequestLog rows over the last `days` days, in time order, in batches. Returns seconds taken."""
    local, clouds, keys = usage_seed_fixtures(team=team)
    rng = random.Random(seed)
    end = time.time()
    span = days * 86400
    began = time.monotonic()
    key_weights = (40, 25, 20, 10, 5)
    for first in range(0, count, BATCH):
        rows = []
        for i in range(first, min(first + BATCH, count)):
            at = end - span + (i + rng.random()) * span / count
            hour = (at % 86400) / 3600
            busy = 0.5 + 0.5 * math.sin((hour - 8) / 24 * 2 * math.pi)  # a working day: busier in the afternoon
            channel = local if rng.random() < 0.6 + 0.2 * busy else clouds[rng.random() < 0.3]
            is_local = channel is local
            prompt = int(rng.lognormvariate(6.6, 0.6))
            completion = int(rng.lognormvariate(5.2, 0.7))
            cached = int(prompt * rng.uniform(0.4, 0.8)) if is_local else int(prompt * rng.uniform(0, 0.3))
            failed = rng.random() < 0.012
            ttft = rng.lognormvariate(math.log(140 if is_local else 550), 0.45) * (1 + busy * 0.5)
            latency = ttft + completion * (18 if is_local else 12) * rng.uniform(0.8, 1.3)
            fell_back = not is_local and rng.random() < 0.08
            rows.append(RequestLog(
                team=team, key=rng.choices(keys, key_weights)[0], channel=channel,
                created_at=datetime.fromtimestamp(at, tz=timezone.utc), endpoint="chat",
                model=LOCAL_MODEL if is_local else channel.model_id, stream=rng.random() < 0.7,
                status_code=502 if failed else 200, outcome="error" if failed else "ok",
                error_kind="upstream_5xx" if failed else "", attempts=2 if fell_back else 1, fell_back=fell_back,
                prompt_tokens=0 if failed else prompt, completion_tokens=0 if failed else completion,
                cached_tokens=0 if failed else cached, ttft_ms=None if failed else round(ttft, 1),
                latency_ms=round(latency, 1), cost=0 if failed else channel.cost(prompt, completion, cached)))
        with transaction.atomic():
            RequestLog.objects.bulk_create(rows)
        if on_progress:
            on_progress(min(first + BATCH, count))
    return time.monotonic() - began


def usage_seed_sql(*, team, count, days=DAYS, chunk=1_000_000, on_progress=None):
    """The same kind of records as usage_seed, generated inside the database by one INSERT ... SELECT per million
    (PostgreSQL's generate_series, SQLite's recursive CTE): 10 million rows in minutes instead of half an hour.
    Distributions are uniform here (the benchmark measures reads, which do not depend on them). Returns seconds."""
    from django.db import connection


    local, clouds, keys = usage_seed_fixtures(team=team)
    postgres = connection.vendor == "postgresql"
    uniform = "random()" if postgres else "((abs(random()) % 1000000) / 1000000.0)"
    end = time.time()
    span = days * 86400
    # Derived columns read the row's own random draws (u1 channel, u2 key, u3 failure, u4-u6 sizes and times).
    qwen, deepseek = clouds
    channel = f"CASE WHEN u1 < 0.7 THEN {local.pk} WHEN u1 < 0.91 THEN {qwen.pk} ELSE {deepseek.pk} END"
    model = f"CASE WHEN u1 < 0.7 THEN '{LOCAL_MODEL}' WHEN u1 < 0.91 THEN '{qwen.model_id}' " \
            f"ELSE '{deepseek.model_id}' END"
    key = "CASE " + " ".join(f"WHEN u2 < {bound} THEN {k.pk}" for bound, k in zip((0.4, 0.65, 0.85, 0.95), keys)) \
        + f" ELSE {keys[-1].pk} END"
    failed = "u3 < 0.012"
    prompt = f"CASE WHEN {failed} THEN 0 ELSE CAST(200 + u4 * 1800 AS INTEGER) END"
    completion = f"CASE WHEN {failed} THEN 0 ELSE CAST(20 + u5 * 400 AS INTEGER) END"
    cached = f"CASE WHEN {failed} THEN 0 WHEN u1 < 0.7 THEN CAST((200 + u4 * 1800) * 0.6 AS INTEGER) " \
             f"ELSE CAST((200 + u4 * 1800) * 0.15 AS INTEGER) END"
    ttft = f"CASE WHEN {failed} THEN NULL WHEN u1 < 0.7 THEN 60 + u6 * 340 ELSE 200 + u6 * 1300 END"

    def price(kind):
        return (f"CASE WHEN u1 < 0.7 THEN 0 WHEN u1 < 0.91 THEN {getattr(qwen, kind)} "
                f"ELSE {getattr(deepseek, kind)} END")

    cost = (f"CASE WHEN {failed} THEN 0 ELSE (({prompt}) - ({cached})) * {price('price_input_per_million')} / 1e6 "
            f"+ ({cached}) * {price('price_cached_per_million')} / 1e6 "
            f"+ ({completion}) * {price('price_output_per_million')} / 1e6 END")
    at = "to_timestamp({start} + (i + u7) * {step})" if postgres else \
        "strftime('%Y-%m-%d %H:%M:%f', {start} + (i + u7) * {step}, 'unixepoch')"
    known = {
        "team_id": str(team.pk), "key_id": key, "channel_id": channel, "route_id": "NULL", "created_at": at,
        "endpoint": "'chat'", "model": model, "stream": "u5 < 0.7", "status_code": f"CASE WHEN {failed} THEN 502 "
        "ELSE 200 END", "outcome": f"CASE WHEN {failed} THEN 'error' ELSE 'ok' END",
        "error_kind": f"CASE WHEN {failed} THEN 'upstream_5xx' ELSE '' END", "attempts": "1",
        "fell_back": "u1 >= 0.7 AND u2 < 0.08", "prompt_tokens": prompt, "completion_tokens": completion,
        "cached_tokens": cached, "ttft_ms": ttft, "latency_ms": f"COALESCE({ttft}, 30) + ({completion}) * 15",
        "cost": cost}
    columns, values, params = [], [], []
    for field in RequestLog._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(connection.ops.quote_name(field.column))
        if field.column in known:
            values.append(known[field.column])
        elif field.null and not field.has_default():
            values.append("NULL")
        else:  # a column added by another feature: its default
            values.append("\x00")  # a placeholder, once the % signs of the SQL are escaped
            params.append(field.get_db_prep_save(field.get_default(), connection))
    draws = ", ".join(f"{uniform} AS u{n}" for n in range(1, 8))
    began = time.monotonic()
    for first in range(0, count, chunk):
        size = min(chunk, count - first)
        step = span / count
        # MATERIALIZED: each row's draws are made once (SQLite would otherwise inline random() into every use).
        if postgres:
            source = f"r AS MATERIALIZED (SELECT i, {draws} FROM generate_series({first}, {first + size - 1}) AS g(i))"
        else:
            source = (f"RECURSIVE s(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM s WHERE i < {first + size - 1}),"
                      f" r AS MATERIALIZED (SELECT i, {draws} FROM s)")
        select = ", ".join(values).replace("{start}", str(end - span)).replace("{step}", repr(step))
        table = connection.ops.quote_name(RequestLog._meta.db_table)
        sql = f"INSERT INTO {table} ({', '.join(columns)}) WITH {source} SELECT {select} FROM r ORDER BY i"
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql.replace("%", "%%").replace("\x00", "%s"), params)
        if on_progress:
            on_progress(first + size)
    return time.monotonic() - began
