"""Budgets that cannot be overshot: before a request goes, its maximum (the prompt's estimate plus its max_tokens,
at the highest price among the channels it may reach) is held against every budget it spends from; at the end the
real figure is counted and the hold released (enforcement.count), on failure too.

The gateway's admission script (panel/gateway/admission.py) refuses a request whose maximum does not fit beside the
month's spend and what requests in flight hold, and holds it otherwise, in the same Redis call that reads the
counters. A hold lives in two counters per budget (budgets/counters.held_keys) that expire an hour after the last
request held anything: a gateway killed mid-request frees its holds by then."""
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from django.conf import settings

from panel.budgets.counters import UNIT, budget_owner, held_keys, money_from_units

HELD_SECONDS = 3600


@dataclass(frozen=True)
class Reservation:
    """What one request holds: the held counters of each budget it spends from, and the amounts; and the tokens it
    holds in its key's per-minute window (gateway/admission.py), in that window's counter."""

    keys: tuple
    money_units: int
    tokens: int
    window_key: str | None = None
    window_tokens: int = 0


def reservation(held_keys, request_max, *, window_key=None, window_tokens=0):
    """What an admitted request holds: its maximum against the budgets' held counters (`request_max` None: no
    budget) and its tokens in its key's per-minute window; None when it holds nothing."""
    if request_max is None and not window_tokens:
        return None
    money, tokens = (request_max.money_units, request_max.tokens) if request_max else (0, 0)
    return Reservation(tuple(held_keys) if request_max else (), money, tokens, window_key=window_key,
                       window_tokens=window_tokens)


@dataclass(frozen=True)
class Maximum:
    """A request's largest possible charge, and the figures it was worked out from (for a refusal's words)."""

    money_units: int
    tokens: int
    prompt_tokens: int
    completion_tokens: int


def completion_limit(body):
    """The completion tokens a request may produce: its own limit in any API, else the gateway's default."""
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return settings.BUDGET_RESERVE_COMPLETION_TOKENS


def tool_call_limit(body):
    """The provider tool calls billed per call that a request allows at most: the max_uses of its web search tools
    (Anthropic's); 0 when it offers none or does not bound them (their charges are then counted at the end only)."""
    return sum(tool["max_uses"] for tool in body.get("tools") or () if isinstance(tool, dict)
               and str(tool.get("type", "")).startswith("web_search") and isinstance(tool.get("max_uses"), int)
               and not isinstance(tool["max_uses"], bool) and tool["max_uses"] > 0)


def maximum(prompt_tokens, body, channels):
    """The request's maximum at the highest price among `channels` (Channel rows; none priced: no money): its prompt,
    its completion limit and the tool calls it allows."""
    completion = completion_limit(body)
    calls = {"tool_calls": tool_call_limit(body)} if body.get("tools") else {}
    cost = max((channel.cost(prompt_tokens, completion, **calls) for channel in channels), default=Decimal(0))
    units = int((cost * UNIT).to_integral_value(rounding=ROUND_CEILING))
    return Maximum(units, prompt_tokens + completion, prompt_tokens, completion)


def set_completion_limit(body, tokens):
    """Set a request's completion limit in place, in the field it used (else the API's own: max_output_tokens for
    /v1/responses, max_tokens otherwise)."""
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if name in body:
            body[name] = tokens
            return
    body["max_output_tokens" if "input" in body and "messages" not in body else "max_tokens"] = tokens


def fitting_completion(scopes, index, counters, held, request_max, channels):
    """The most completion tokens a request may still ask for within the budget at `index` of `scopes` (beside its
    spend, `counters`, and what requests in flight hold, `held`), at the highest price among `channels`; None when
    not even one token fits."""
    _, _, limits = scopes[index]
    prompt = request_max.prompt_tokens
    fits = []
    if limits.tokens is not None:
        fits.append(limits.tokens - int(counters[2 * index + 1] or 0) - int(held[1]) - prompt)
    if limits.money is not None:
        left = int(Decimal(limits.money) * UNIT) - int(counters[2 * index] or 0) - int(held[0])
        low, high = 0, request_max.completion_tokens - 1  # the largest completion whose maximum fits, by bisection
        while low < high:
            middle = (low + high + 1) // 2
            if maximum(prompt, {"max_tokens": middle}, channels).money_units <= left:
                low = middle
            else:
                high = middle - 1
        fits.append(low)
    fit = min(fits, default=0)
    return fit if fit >= 1 else None


def scope_held_keys(scopes, month):
    """The held counters of `scopes`, money then tokens per scope, as the admission script reads them."""
    return [name for scope, ident, _ in scopes for name in held_keys(month, scope, ident)]


def shortfall_words(scopes, index, counters, held, request_max):
    """The refusal's words when the budget at `index` (0-based) of `scopes` cannot cover `request_max` beside its
    spend (`counters`: money and tokens per scope) and what requests in flight hold (`held`: money, tokens)."""
    currency = getattr(settings, "TOKENWISE_CURRENCY", "USD")
    scope, ident, limits = scopes[index]
    whose = budget_owner(scope, ident)
    asked = (f"this request may use up to {request_max.tokens:,} tokens ({request_max.prompt_tokens:,} in its "
             f"prompt, estimated, and max_tokens {request_max.completion_tokens:,})")
    spent_money, spent_tokens = money_from_units(counters[2 * index]), int(counters[2 * index + 1] or 0)
    held_money, held_tokens = money_from_units(held[0]), int(held[1])
    if limits.tokens is not None and spent_tokens + held_tokens + request_max.tokens > limits.tokens:
        left = max(limits.tokens - spent_tokens - held_tokens, 0)
        return (f"{asked}; {whose} monthly budget of {limits.tokens:,} tokens has {left:,} left ({spent_tokens:,} "
                f"spent, {held_tokens:,} held by requests in flight): lower max_tokens or raise the budget")
    cost = money_from_units(request_max.money_units)
    left = max(limits.money - spent_money - held_money, Decimal(0))
    return (f"{asked}, costing up to {cost:.6f} {currency} at the route's highest price; {whose} monthly budget of "
            f"{limits.money} {currency} has {left:.6f} {currency} left ({spent_money:.6f} spent, "
            f"{held_money:.6f} held by requests in flight): lower max_tokens or raise the budget")
