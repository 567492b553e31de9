"""The two checks of the Compare page, per column, as async generators of events (every request goes through
relay.stream_chat, so each one is a RequestLog row like any gateway request).

JSON check: the same prompt N times with response_format json_object; how many answers do not parse. Request
errors are counted apart: they say nothing about the model's JSON.

Prefix-cache check: one long system prompt twice with different user messages; TTFT of the first against the
second. A run id opens the system prompt, so the first request is cold even when the check is run again."""
import secrets

from panel.compare.relay import stream_chat

JSON_ALARM_RATE = 0.03  # above 3 % JSON parse failures a quantized model is not good enough for JSON work
JSON_INSTRUCTION = "Answer with one JSON object and nothing else."
CACHE_DROP_EXPECTED_PERCENT = 20  # below this the page says what to check (30-60 % is usual on a local vLLM)
CACHE_MIN_SYSTEM_CHARS = 2000
CACHE_QUESTIONS = ("Summarise the policy above in one sentence.", "Which rule above is about refunds?")

# A long, fixed system prompt for the check when the user's own is too short to show a cache effect.
POLICY = " ".join(
    f"Rule {number}: when a customer asks about {topic}, answer politely, cite the relevant section of the "
    f"handbook, never promise what the handbook does not allow, and offer to hand over to a person if the "
    f"customer is still unhappy after two answers."
    for number, topic in enumerate(
        ("refunds", "delivery times", "damaged parcels", "invoices", "account deletion", "passwords",
         "price changes", "discount codes", "gift cards", "warranty claims", "returns abroad", "data exports",
         "privacy requests", "subscription pauses", "plan upgrades", "plan downgrades", "failed payments",
         "currency conversion", "tax receipts", "shipping addresses"), start=1))


async def json_check_events(column, *, system_prompt, message, sampling, repeats, team_id):
    """Yield {"type": "attempt", ...} per request, then {"type": "summary", ...}."""
    system = system_prompt if "json" in (system_prompt + message).lower() else \
        f"{system_prompt}\n\n{JSON_INSTRUCTION}".strip()
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": message}]
    payload = {"messages": messages, "response_format": {"type": "json_object"}, **sampling}
    valid = errors = 0
    for number in range(1, repeats + 1):
        done = await _last(stream_chat(column, payload, team_id=team_id))
        if not done["ok"]:
            errors += 1
        elif done["json_valid"]:
            valid += 1
        yield {"type": "attempt", "number": number, "ok": done["ok"], "json_valid": done["json_valid"],
               "text": done["text"][:300], "diagnosis": done["diagnosis"], "metrics": done["metrics"]}
    answered = repeats - errors
    failures = answered - valid
    rate = failures / answered if answered else None
    yield {"type": "summary", "repeats": repeats, "answered": answered, "errors": errors, "failures": failures,
           "failure_rate": round(rate, 4) if rate is not None else None,
           "alarm": rate is not None and rate > JSON_ALARM_RATE, "alarm_rate": JSON_ALARM_RATE}


def cache_system_prompt(system_prompt):
    base = system_prompt if len(system_prompt) >= CACHE_MIN_SYSTEM_CHARS else POLICY
    return f"Check run {secrets.token_hex(6)}.\n{base}"


def cache_advice(column):
    advice = ["Dynamic content in the system prompt: a date, a time, a request id or a user name near its start "
              "changes the prefix on every request, and only an identical prefix is reused (block by block).",
              "The shared prefix must be longer than one KV-cache block (the profile's block_size tokens) to be "
              "cached at all."]
    if any(target.channel.is_local for target in column.targets):
        advice.insert(0, "Prefix caching off: check enable_prefix_caching in the deployment's serving profile and "
                         "the deployment page's line of what vLLM applied (--enable-prefix-caching).")
    else:
        advice.insert(0, "A cloud provider caches only prompts above a minimum length (often 1024 tokens), some "
                         "only on request, some not at all: its usage shows prompt_tokens_details.cached_tokens.")
    return advice


async def prefix_cache_check_events(column, *, system_prompt, team_id, max_tokens=8):
    """Yield {"type": "attempt", ...} for each of the two requests, then {"type": "summary", ...}."""
    system = cache_system_prompt(system_prompt)
    ttfts, cached, prompts = [], [], []
    for number, question in enumerate(CACHE_QUESTIONS, start=1):
        payload = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                   "max_tokens": max_tokens, "temperature": 0}
        done = await _last(stream_chat(column, payload, team_id=team_id))
        yield {"type": "attempt", "number": number, "ok": done["ok"], "diagnosis": done["diagnosis"],
               "metrics": done["metrics"]}
        if not done["ok"]:
            yield {"type": "summary", "ok": False, "diagnosis": done["diagnosis"]}
            return
        ttfts.append(done["metrics"]["ttft_ms"])
        cached.append(done["metrics"]["cached_tokens"])
        prompts.append(done["metrics"]["prompt_tokens"])
    first, second = ttfts
    drop = (first - second) / first * 100 if first and second is not None else None
    dropped = drop is not None and drop >= CACHE_DROP_EXPECTED_PERCENT
    yield {"type": "summary", "ok": True, "first_ttft_ms": first, "second_ttft_ms": second,
           "drop_percent": round(drop, 1) if drop is not None else None, "cached_tokens": cached[1],
           "prompt_tokens": prompts[1], "dropped": dropped, "advice": [] if dropped else cache_advice(column)}


async def _last(events):
    last = None
    async for event in events:
        last = event
    return last
