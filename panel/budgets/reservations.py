"""Budgets that cannot be overshot: before a request goes, its maximum is held against every budget it spends from;
at the end the real figure is counted and the hold released (enforcement.count), on failure too.

A request's maximum is its prompt's billed tokens at most (`prompt_bound`) plus the completion it may produce (its
max_tokens, times the answers it asks for), at the highest price among the channels it may reach. The prompt's
bound is not an estimate: a byte-level BPE tokenizer (OpenAI's, Llama 3's, Qwen's, SmolLM's) or a SentencePiece one
with byte fallback never makes more tokens of a text than it has UTF-8 bytes. So the bound is the bytes of every text
the request carries (and of the JSON of its structured values: tool definitions, tool calls), plus what the chat
template adds: an allowance per request (a default system prompt, the answer's header), per message (role markers),
for tools (the tool-use instructions) and per image, audio or file part. A channel that bills more than that teaches
the gateway: `excess_seen` says by how much, and later holds on that channel cover it (decision 0090).

The gateway's admission script (panel/gateway/admission.py) refuses a request whose maximum does not fit beside the
month's spend and what requests in flight hold, and holds it otherwise, in the same Redis call that reads the
counters. A hold lives in two counters per budget (budgets/counters.held_keys) that expire an hour after the last
request held anything: a gateway killed mid-request frees its holds by then."""
import json
import math
import unicodedata
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from django.conf import settings

from panel.budgets.counters import UNIT, budget_owner, held_keys, money_from_units

HELD_SECONDS = 3600
COMPLETIONS_DEFAULT_TOKENS = 16  # a completions request without max_tokens: OpenAI's default, and vLLM's
LIMIT_NAMES = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# Content parts that are no text: each is held at TOKENWISE_BUDGET_MEDIA_TOKENS (OpenAI's image, audio and file
# parts, the Responses API's input parts, Anthropic's image and document blocks).
MEDIA_TYPES = frozenset({"image_url", "input_image", "input_audio", "file", "input_file", "image", "document"})
# A part's fields a template does not print as text: its kind, and the role the per-message allowance covers.
NOT_PRINTED = frozenset({"role", "type", "cache_control", "status"})
# An `input` body's fields that only a Responses request has, and those only an embeddings request has.
RESPONSES_FIELDS = frozenset({"instructions", "tools", "tool_choice", "reasoning", "text", "store", "stream",
                              "previous_response_id", "conversation", "max_output_tokens", "temperature", "top_p",
                              "truncation", "include", "parallel_tool_calls", "max_tool_calls"})
EMBEDDINGS_FIELDS = frozenset({"encoding_format", "dimensions"})


@dataclass(frozen=True)
class PromptBound:
    """The most tokens a request's prompt may be billed: `tokens`, with what its channels taught included
    (`excess`: tokens per request and per media part), and its `media` parts (images, audio, files)."""

    tokens: int
    media: int = 0
    excess: tuple = (0, 0)


@dataclass(frozen=True)
class Reservation:
    """What one request holds: the held counters of each budget it spends from, and the amounts; and the tokens it
    holds in its key's per-minute window (gateway/admission.py), in that window's counter. `prompt` and `channels`
    ((id, name) of the route's channels) let its end tell whether its prompt billed more than its bound."""

    keys: tuple
    money_units: int
    tokens: int
    window_key: str | None = None
    window_tokens: int = 0
    prompt: PromptBound | None = None
    channels: tuple = ()
    # Taken from its process's advance (gateway/advances.py) rather than held by the admission script: what it does
    # not use goes back there (`pool.settle`, `pool.window_back`), not to Redis. The window's minute it was taken in.
    pool: object = None
    window_minute: int = 0


def reservation(held_keys, request_max, *, window_key=None, window_tokens=0, prompt=None, channels=(), pool=None,
                window_minute=0):
    """What an admitted request holds: its maximum against the budgets' held counters (`request_max` None: no
    budget) and its tokens in its key's per-minute window; None when it holds nothing (and took nothing of an
    advance: a `pool` request always has one, so that its end is given back to the advance)."""
    if request_max is None and not window_tokens and pool is None:
        return None
    money, tokens = (request_max.money_units, request_max.tokens) if request_max else (0, 0)
    return Reservation(tuple(held_keys) if request_max else (), money, tokens, window_key=window_key,
                       window_tokens=window_tokens, prompt=prompt if request_max else None,
                       channels=tuple((channel.id, channel.name) for channel in channels) if request_max else (),
                       pool=pool, window_minute=window_minute)


@dataclass(frozen=True)
class Maximum:
    """A request's largest possible charge, and the figures it was worked out from (for a refusal's words):
    `completion_tokens` per answer (its max_tokens, or the gateway's default when `limit_set` is False), and the
    request's API as its body tells it (`body_api`)."""

    money_units: int
    tokens: int
    prompt_tokens: int
    completion_tokens: int
    answers: int = 1
    tool_calls: int = 0
    limit_set: bool = True
    api: str | None = "chat"


# ------------------------------------------------------------------------------------------------- the prompt

def prompt_bound(body, excess=(0, 0)):
    """The most tokens `body`'s prompt may be billed, in any API (chat, completions, Messages, Responses): its
    text's UTF-8 bytes and the allowances for the template, with `excess` (what its channels taught: tokens per
    request, per media part) added."""
    tally = _Tally()
    tally.top(body)
    media = tally.media
    tokens = (tally.bytes + tally.messages * settings.BUDGET_MESSAGE_TOKENS + settings.BUDGET_TEMPLATE_TOKENS
              + (settings.BUDGET_TOOLS_TOKENS if tally.tools else 0)
              + media * (settings.BUDGET_MEDIA_TOKENS + excess[1]) + excess[0])
    return PromptBound(tokens, media, tuple(excess))


class _Tally:
    """The bytes, messages, media parts and tools of a request body, walked once."""

    def __init__(self):
        self.bytes = self.messages = self.media = 0
        self.tools = False

    def top(self, body):
        for message in body.get("messages") if isinstance(body.get("messages"), list) else ():
            self.message(message)
        for name in ("system", "instructions"):  # Anthropic's system prompt; the Responses API's instructions
            if body.get(name):
                self.messages += 1
                self.text(body[name])
        given = body.get("input")  # the Responses API: a string, or a list of items that are each a turn
        if isinstance(given, str):
            self.messages += 1
            self.text(given)
        elif isinstance(given, list):
            for item in given:
                self.message(item)
        self.prompt(body.get("prompt"))
        for name in ("tools", "functions"):
            if body.get(name):
                self.tools = True
                self.structured(body[name])
        for name in ("tool_choice", "response_format", "text"):  # a named tool, a JSON schema the model is shown
            if isinstance(body.get(name), dict):
                self.structured(body[name])

    def message(self, message):
        self.messages += 1
        self.text(message)

    def text(self, value):
        """A string, a list of content parts or one part (a message is one too: its role is not printed as text)."""
        if isinstance(value, str):
            self.bytes += len(value) if value.isascii() else _text_bytes(value)
        elif isinstance(value, list):
            for item in value:
                self.text(item)
        elif isinstance(value, dict):
            self.part(value)
        elif value is not None:
            self.structured(value)

    def part(self, part):
        if part.get("type") in MEDIA_TYPES:
            self.media += 1
            source = part.get("source")
            if isinstance(source, dict) and source.get("type") in ("text", "content"):  # a document of plain text
                self.text(source.get("data") or source.get("content"))
            return
        for name, value in part.items():
            if name in NOT_PRINTED:
                continue
            if isinstance(value, (str, list)) or name == "content":
                self.text(value)
            else:  # tool call arguments, a tool_use block's input: printed as JSON
                self.structured(value)

    def structured(self, value):
        self.bytes += len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))

    def prompt(self, prompt):
        """A completions prompt: text, token ids (one token each), or a list of either."""
        if isinstance(prompt, str):
            self.text(prompt)
        elif isinstance(prompt, int) and not isinstance(prompt, bool):
            self.bytes += 1
        elif isinstance(prompt, list):
            for item in prompt:
                self.prompt(item)


def _text_bytes(text):
    """The UTF-8 bytes of a text that is not ASCII, or of its NFC or NFKC form when longer: tokenizers that normalize
    (Qwen's NFC) see that form, and a few characters decompose into longer ones (Hebrew presentation forms, U+FDFA)."""
    found = len(text.encode("utf-8", "surrogatepass"))
    for form in ("NFC", "NFKC"):
        if not unicodedata.is_normalized(form, text):
            found = max(found, len(unicodedata.normalize(form, text).encode("utf-8", "surrogatepass")))
    return found


def excess_seen(reservation, tokens):
    """(tokens per request, per media part) its channels should be taught after a request that used `tokens` while
    holding `reservation`, when that is more than it held (a template or media part bigger than the allowances, or
    a channel that ignored max_tokens); else None. A request with media parts puts the excess on them."""
    if reservation is None or reservation.prompt is None or not reservation.keys or tokens <= reservation.tokens:
        return None
    over = tokens - reservation.tokens
    per_request, per_media = reservation.prompt.excess
    if reservation.prompt.media:
        return per_request, per_media + math.ceil(over / reservation.prompt.media)
    return per_request + over, per_media


# ------------------------------------------------------------------------------------------------- the answer

def body_api(body):
    """The API of a request body, as far as the body tells (admission is not told the path): "chat" (OpenAI's, and
    Anthropic's Messages), "completions", "responses" or "embeddings"; None for a bare `input` string, which either
    could send."""
    if "messages" in body:
        return "chat"
    given = body.get("input")
    if given is None:
        return "completions" if "prompt" in body else None
    if isinstance(given, list) and any(isinstance(item, dict) for item in given):
        return "responses"  # its items; an embeddings input is text or token ids
    if isinstance(given, list) or EMBEDDINGS_FIELDS.intersection(body):
        return "embeddings"
    return "responses" if RESPONSES_FIELDS.intersection(body) else None


def limit_set(body):
    """Whether the request sets its completion limit (in any API's field)."""
    return any(_whole(body.get(name)) for name in LIMIT_NAMES)


def completion_limit(body):
    """The completion tokens one answer of a request may produce: its own limit in any API, else the gateway's
    default (a completions request's own default, 16; none for embeddings)."""
    for name in LIMIT_NAMES:
        if _whole(body.get(name)):
            return body[name]
    api = body_api(body)
    if api == "embeddings":
        return 0
    return COMPLETIONS_DEFAULT_TOKENS if api == "completions" else settings.BUDGET_RESERVE_COMPLETION_TOKENS


def limit_settable(body):
    """Whether the gateway may set the request's completion limit: an API that has one, known from the body."""
    return body_api(body) in ("chat", "completions", "responses")


def answers(body):
    """How many answers a request is billed for: `n` (chat, completions) or completions' `best_of`, for each of
    a completions request's prompts."""
    count = max(body["n"] if _whole(body.get("n")) else 1, body["best_of"] if _whole(body.get("best_of")) else 1)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(item, (str, list)) for item in prompt):
        count *= len(prompt)  # a batch of prompts, not one prompt of token ids
    return count


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def set_completion_limit(body, tokens):
    """Set a request's completion limit in place, in the field it used (else the API's own: max_output_tokens for
    /v1/responses, max_tokens otherwise)."""
    for name in LIMIT_NAMES:
        if name in body:
            body[name] = tokens
            return
    body["max_output_tokens" if "input" in body and "messages" not in body else "max_tokens"] = tokens


def tool_call_limit(body):
    """The provider tool calls billed per call that a request allows at most: the max_uses of its web search tools
    (Anthropic's); 0 when it offers none or does not bound them (their charges are then counted at the end only)."""
    return sum(tool["max_uses"] for tool in body.get("tools") or () if isinstance(tool, dict)
               and str(tool.get("type", "")).startswith("web_search") and isinstance(tool.get("max_uses"), int)
               and not isinstance(tool["max_uses"], bool) and tool["max_uses"] > 0)


# ------------------------------------------------------------------------------------------------- the maximum

def maximum(prompt_tokens, body, channels, *, limit_given=None):
    """The request's maximum at the highest price among `channels` (Channel rows; none priced: no money): its
    prompt's bound (`prompt_tokens`), its completion limit for each answer and the tool calls it allows.
    `limit_given`: whether the client set the limit (when the gateway may have set it since), for the words."""
    completion, count = completion_limit(body), answers(body)
    calls = tool_call_limit(body) if body.get("tools") else 0
    units = highest_cost_units(channels, prompt_tokens, completion * count, calls)
    return Maximum(units, prompt_tokens + completion * count, prompt_tokens, completion, count, calls,
                   limit_set(body) if limit_given is None else limit_given, body_api(body))


def highest_cost_units(channels, prompt, completion, tool_calls=0):
    """The most `prompt` and `completion` tokens (and `tool_calls`) may cost on any of `channels`, in money units,
    rounded up: the whole prompt may be billed as a cache write, which some channels price above input."""
    calls = {"tool_calls": tool_calls} if tool_calls else {}
    cost = max((max(channel.cost(prompt, completion, **calls),
                    channel.cost(prompt, completion, 0, prompt, **calls)) for channel in channels), default=Decimal(0))
    return int((cost * UNIT).to_integral_value(rounding=ROUND_CEILING))


def fitting_completion(scopes, index, counters, held, request_max, channels):
    """The most completion tokens per answer a request may still ask for within the budget at `index` of `scopes`
    (beside its spend, `counters`, and what requests in flight hold, `held`), at the highest price among `channels`;
    None when not even one token fits."""
    _, _, limits = scopes[index]
    prompt, count = request_max.prompt_tokens, request_max.answers
    fits = []
    if limits.tokens is not None:
        fits.append((limits.tokens - int(counters[2 * index + 1] or 0) - int(held[1]) - prompt) // count)
    if limits.money is not None:
        left = int(Decimal(limits.money) * UNIT) - int(counters[2 * index] or 0) - int(held[0])
        low, high = 0, request_max.completion_tokens - 1  # the largest completion whose maximum fits, by bisection
        while low < high:
            middle = (low + high + 1) // 2
            if highest_cost_units(channels, prompt, middle * count, request_max.tool_calls) <= left:
                low = middle
            else:
                high = middle - 1
        fits.append(low)
    fit = min(fits, default=0)
    return fit if fit >= 1 else None


def scope_held_keys(scopes, month):
    """The held counters of `scopes`, money then tokens per scope, as the admission script reads them."""
    return [name for scope, ident, _ in scopes for name in held_keys(month, scope, ident)]


# ------------------------------------------------------------------------------------------------- the words

def asked_words(request_max):
    """What a request may use, in a refusal's words."""
    prompt = (f"{request_max.prompt_tokens:,} in its prompt at most, counting a token per byte of its text plus the "
              f"chat template")
    if not request_max.completion_tokens:
        return f"this request may use up to {request_max.tokens:,} tokens ({prompt})"
    answer = (f"max_tokens {request_max.completion_tokens:,}" if request_max.limit_set
              else f"{request_max.completion_tokens:,} for its answer, as it sets no max_tokens")
    if request_max.answers > 1:
        answer += f" for each of {request_max.answers} answers"
    return f"this request may use up to {request_max.tokens:,} tokens ({prompt}, and {answer})"


def remedy_words(request_max):
    """What the client can do about a refusal: lower its limit, or, when it set none, what the gateway could not."""
    if not request_max.completion_tokens:
        return "shorten the input or raise the budget"
    if request_max.limit_set:
        return "lower max_tokens or raise the budget"
    if request_max.api is None:  # an input the gateway cannot tell from an embeddings request: no limit set for it
        return "set max_output_tokens or raise the budget"
    return ("not even one token of answer fits beside its prompt: shorten the prompt, wait for requests in flight to "
            "end or raise the budget")


def shortfall_words(scopes, index, counters, held, request_max):
    """The refusal's words when the budget at `index` (0-based) of `scopes` cannot cover `request_max` beside its
    spend (`counters`: money and tokens per scope) and what requests in flight hold (`held`: money, tokens). A
    request without max_tokens comes here only when not even one token of answer fits, or when the gateway cannot
    set one for it."""
    currency = getattr(settings, "TOKENWISE_CURRENCY", "USD")
    scope, ident, limits = scopes[index]
    whose = budget_owner(scope, ident)
    remedy = remedy_words(request_max)
    spent_money, spent_tokens = money_from_units(counters[2 * index]), int(counters[2 * index + 1] or 0)
    held_money, held_tokens = money_from_units(held[0]), int(held[1])
    if limits.tokens is not None and spent_tokens + held_tokens + request_max.tokens > limits.tokens:
        left = max(limits.tokens - spent_tokens - held_tokens, 0)
        return (f"{asked_words(request_max)}; {whose} monthly budget of {limits.tokens:,} tokens has {left:,} left "
                f"({spent_tokens:,} spent, {held_tokens:,} held for requests in flight): {remedy}")
    cost = money_from_units(request_max.money_units)
    left = max(limits.money - spent_money - held_money, Decimal(0))
    return (f"{asked_words(request_max)}, costing up to {cost:.6f} {currency} at the route's highest price; {whose} "
            f"monthly budget of {limits.money} {currency} has {left:.6f} {currency} left ({spent_money:.6f} spent, "
            f"{held_money:.6f} held for requests in flight): {remedy}")
