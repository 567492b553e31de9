"""What a budget holds for a request (budgets/reservations.py, decision 0090): its prompt's bound in every API (a
token per byte of its text, the template's allowances, media parts), its answers, the highest price; a request
without max_tokens fitted to what the budget has left, or refused in words when not one token fits; a channel that
bills more than the bound teaches the gateway to hold more on it; the panel's stand-in key holds against its team's
budget only."""
import json
import subprocess
import threading
from decimal import Decimal
from types import SimpleNamespace

import httpx
import pytest
import redis
from django.conf import settings

from panel.budgets import enforcement
from panel.budgets.counters import counter_keys, excess_key, held_keys, month_of
from panel.budgets.reservations import (
    PromptBound,
    Reservation,
    answers,
    body_api,
    completion_limit,
    excess_seen,
    limit_settable,
    maximum,
    prompt_bound,
    shortfall_words,
)
from panel.budgets.services import budget_set, budget_usage
from panel.channels.models import Channel
from panel.channels.rules import input_token_estimate
from panel.gateway import admission
from panel.usage.models import RequestLog
from tests.budgets.test_concurrent_budgets import templated  # noqa: F401 (fixture)
from tests.support.environment import ROOT
from tests.support.fake_provider import template_tokens
from tests.support.gateway import gateway_for
from tests.support.waiting import run_coroutine, wait_until

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 20}
BARE = {key: value for key, value in CHAT.items() if key != "max_tokens"}
REAL_USE = 35 + 20  # what the templated provider bills CHAT: SmolLM2's template and 20 tokens of answer


@pytest.fixture
def gateway(transactional_db, request):
    yield from gateway_for(request, TOKENWISE_BUDGET_CACHE_SECONDS="0")


@pytest.fixture
def gateway_without_allowances(transactional_db, request):
    """A gateway whose bound has no room for the chat template: every templated prompt bills past it. Without
    advances, so that what is held is the request's own hold."""
    yield from gateway_for(request, TOKENWISE_BUDGET_CACHE_SECONDS="0", TOKENWISE_BUDGET_TEMPLATE_TOKENS="0",
                           TOKENWISE_BUDGET_MESSAGE_TOKENS="0", TOKENWISE_GATEWAY_ADVANCES="0")


def post(gateway, raw, body):
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {raw}"})


def logged(count):
    return wait_until(lambda: RequestLog.objects.count() >= count, seconds=10, message=f"{count} usage records")


# ------------------------------------------------------------------------------------------------- the bound

SAME_TURNS = {  # one conversation in each API: a system prompt, a question, an answer, a follow-up
    "chat": {"messages": [{"role": "system", "content": "Answer in French."},
                          {"role": "user", "content": "Où est la gare ? 東京駅"},
                          {"role": "assistant", "content": "À droite 🙂"},
                          {"role": "user", "content": [{"type": "text", "text": "Et le musée ?"}]}]},
    "messages": {"system": "Answer in French.",
                 "messages": [{"role": "user", "content": "Où est la gare ? 東京駅"},
                              {"role": "assistant", "content": [{"type": "text", "text": "À droite 🙂"}]},
                              {"role": "user", "content": [{"type": "text", "text": "Et le musée ?"}]}]},
    "responses": {"instructions": "Answer in French.",
                  "input": [{"role": "user", "content": [{"type": "input_text", "text": "Où est la gare ? 東京駅"}]},
                            {"type": "message", "role": "assistant",
                             "content": [{"type": "output_text", "text": "À droite 🙂"}]},
                            {"role": "user", "content": "Et le musée ?"}]},
}


@pytest.mark.parametrize("api", sorted(SAME_TURNS))
def test_the_bound_covers_a_templates_bill_in_every_api(api):
    """Its text at a token a byte, four messages and the template: above what a chat template bills for the same
    turns (the templated provider: a token per 3 bytes, 5 per message, 3 for the answer's header) and the estimate."""
    body = SAME_TURNS[api]
    text = "Answer in French." + "Où est la gare ? 東京駅" + "À droite 🙂" + "Et le musée ?"
    assert prompt_bound(body) == PromptBound(len(text.encode()) + 4 * settings.BUDGET_MESSAGE_TOKENS
                                             + settings.BUDGET_TEMPLATE_TOKENS)
    assert prompt_bound(body).tokens > template_tokens(SAME_TURNS["chat"]) > input_token_estimate(body)


# In the engine's venv: the demo model's tokenizer (engine/build_demo_model.py: byte-level BPE shaped like Qwen2's,
# NFC first, 4,096 tokens trained on Python sources, a ChatML template with a default system prompt) counts the
# prompt tokens of each conversation read from stdin.
DEMO_TOKENIZER = """
import json, sys
from engine import build_demo_model as demo
from transformers import PreTrainedTokenizerFast
texts, _ = demo.read_corpus(demo.corpus_paths())
tokenizer = PreTrainedTokenizerFast(tokenizer_object=demo.train_tokenizer(texts, demo.MODEL_SHAPE["vocab_size"]),
                                    eos_token=demo.IM_END, chat_template=demo.CHAT_TEMPLATE)
print(json.dumps([len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
                  for messages in json.load(sys.stdin)]))
"""


def test_the_bound_covers_a_real_tokenizer_and_template_even_on_text_it_tokenizes_badly():
    texts = ["one two three four", "Où est la gare ? 東京駅はどこですか。", "def f(x):\n    return x ** 2\n" * 20,
             "".join(chr(0x100 + index * 37 % 0x2F00) for index in range(300)),  # about a token a byte
             "".join(chr(0x1F300 + index * 7 % 0x400) for index in range(200)),
             "".join(chr(32 + index * 13 % 95) for index in range(500)),
             "\ufb2c" * 100,  # 3 bytes each, 6 once NFC decomposes them: more tokens than the text's bytes
             " " * 300, ""]
    conversations = [[{"role": "user", "content": text}] for text in texts] + [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": texts[1]},
         {"role": "assistant", "content": texts[2]}, {"role": "user", "content": texts[0]}]]
    counted = subprocess.run([settings.ENGINE_PYTHON, "-c", DEMO_TOKENIZER], input=json.dumps(conversations),
                             capture_output=True, text=True, cwd=ROOT, timeout=120, check=True)
    real = json.loads(counted.stdout.splitlines()[-1])
    bounds = [prompt_bound({"messages": messages}).tokens for messages in conversations]
    assert all(tokens <= bound for tokens, bound in zip(real, bounds)), list(zip(real, bounds))
    assert real[6] > len(texts[6].encode()) + settings.BUDGET_TEMPLATE_TOKENS  # the case NFC is counted for


def test_the_bound_counts_media_parts_tools_and_structured_values():
    tool = {"name": "weather", "description": "Today's weather", "input_schema": {"type": "object"}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR" * 10_000}}
    body = {"tools": [tool], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Paris?"}, image]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather",
                                           "input": {"city": "Paris"}}]},
    ]}
    bound = prompt_bound(body)
    assert bound.media == 1  # the image's 50,000 base64 bytes are not text: it is held at the media allowance
    json_bytes = len('[{"name": "weather", "description": "Today\'s weather", "input_schema": {"type": "object"}}]')
    text = len("Paris?") + len("t1") + len("weather") + len('{"city": "Paris"}')
    assert bound.tokens == (json_bytes + text + 2 * settings.BUDGET_MESSAGE_TOKENS + settings.BUDGET_TEMPLATE_TOKENS
                            + settings.BUDGET_TOOLS_TOKENS + settings.BUDGET_MEDIA_TOKENS)
    taught = prompt_bound(body, excess=(7, 100))
    assert taught.tokens == bound.tokens + 7 + 100 and taught.excess == (7, 100)


def test_a_completions_prompt_counts_token_ids_and_each_prompt_is_an_answer():
    ids = {"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 10, "n": 2}
    assert prompt_bound(ids).tokens == 5 + settings.BUDGET_TEMPLATE_TOKENS
    assert answers(ids) == 4 and maximum(5, ids, []).tokens == 5 + 40
    assert answers({"prompt": [1, 2, 3], "best_of": 3, "n": 1}) == 3  # token ids of one prompt; best_of billed
    assert completion_limit({"prompt": "Once"}) == 16  # OpenAI's and vLLM's default for completions
    assert completion_limit({"messages": []}) == completion_limit({"input": "x"}) == 4096


def test_the_body_tells_its_api_and_an_embeddings_request_holds_no_answer():
    assert [body_api(body) for body in (
        {"messages": []}, {"prompt": "Once"}, {"input": [{"role": "user", "content": "hi"}]},
        {"input": "hi", "instructions": "Be brief."}, {"input": ["a", "b"]}, {"input": "hi", "dimensions": 256},
        {"input": "hi"})] == ["chat", "completions", "responses", "responses", "embeddings", "embeddings", None]
    embedding = {"model": "embed", "input": ["a", "b"]}
    assert completion_limit(embedding) == 0 and not limit_settable(embedding)
    assert shortfall_words([("team", 1, enforcement.Limits(None, 10))], 0, ["0", "0"], (0, 0),
                           maximum(80, embedding, [])).endswith(
        "this request may use up to 80 tokens (80 in its prompt at most, counting a token per byte of its text plus "
        "the chat template); this team's monthly budget of 10 tokens has 10 left (0 spent, 0 held for requests in "
        "flight): shorten the input or raise the budget")
    bare_input = maximum(80, {"model": "gpt", "input": "hi"}, [])  # Responses or embeddings: held, not limited
    assert bare_input.completion_tokens == 4096 and not limit_settable({"input": "hi"})
    assert shortfall_words([("team", 1, enforcement.Limits(None, 10))], 0, ["0", "0"], (0, 0), bare_input).endswith(
        "set max_output_tokens or raise the budget")


def test_the_money_held_is_the_highest_price_a_cache_write_included():
    writes_dear = Channel(price_input_per_million=Decimal("3"), price_output_per_million=Decimal("15"),
                          price_cache_write_per_million=Decimal("3.75"))
    plain = Channel(price_input_per_million=Decimal("4"), price_output_per_million=Decimal("4"))
    most = maximum(1_000_000, {"max_tokens": 1_000_000}, [writes_dear, plain])
    assert most.money_units == (Decimal("3.75") + Decimal("15")) * 10**8  # the prompt billed as a cache write


def test_what_a_request_used_past_its_hold_is_taught_per_request_or_per_media_part():
    text_only = Reservation(("held",), 0, 100, prompt=PromptBound(80, 0, (5, 0)))
    assert excess_seen(text_only, 100) is None
    assert excess_seen(text_only, 117) == (22, 0)
    with_images = Reservation(("held",), 0, 9000, prompt=PromptBound(8980, 2, (0, 10)))
    assert excess_seen(with_images, 9301) == (0, 161)  # 301 over, on two images
    assert excess_seen(Reservation((), 0, 0, window_key="minute", window_tokens=50), 80) is None  # no budget


def test_the_header_words_a_limit_the_gateway_set():
    assert admission.Admission(limit_added=4096).adapted() == [
        "max_tokens set to 4,096 (the request set none; what a request without one is held for)"]
    assert admission.Admission(limit_added=30, lowered=(4096, 30)).adapted() == [
        "max_tokens set to 30 (the request set none; what the budget has left)"]
    assert admission.Admission(lowered=(20, 6)).adapted() == [
        "max_tokens lowered from 20 to 6 (what the budget has left)"]


# ------------------------------------------------------------------------------------------------- through the gateway

def test_a_request_without_max_tokens_is_fitted_to_what_the_budget_has_left(gateway, templated):
    team, key, raw, provider = templated["team"], templated["key"], templated["raw"], templated["provider"]
    bound = prompt_bound(CHAT).tokens
    budget_set(team=team, key=key, tokens_per_month=REAL_USE + bound + 30, user=templated["alice"])
    assert post(gateway, raw, CHAT).status_code == 200
    fitted = post(gateway, raw, BARE)  # the default 4,096 does not fit; the prompt's bound and 30 do
    assert fitted.status_code == 200, fitted.text
    adapted = fitted.headers["x-tokenwise-adapted"]
    assert "max_tokens set to 30 (the request set none; what the budget has left)" in adapted
    assert provider.seen[-1][3]["max_tokens"] == 30 and fitted.json()["usage"]["completion_tokens"] == 30
    logged(2)
    explicit = post(gateway, raw, CHAT)  # 120 spent, 55 left: its own max_tokens is not lowered
    assert explicit.status_code == 402
    assert (f"this request may use up to {bound + 20} tokens ({bound} in its prompt at most, counting a token per "
            f"byte of its text plus the chat template, and max_tokens 20); this key's monthly budget of "
            f"{REAL_USE + bound + 30} tokens has 55 left (120 spent, 0 held for requests in flight): lower max_tokens "
            f"or raise the budget") in explicit.json()["error"]["message"]
    bare = post(gateway, raw, BARE)
    assert bare.status_code == 402
    assert ("not even one token of answer fits beside its prompt: shorten the prompt, wait for requests in flight to "
            "end or raise the budget") in bare.json()["error"]["message"]
    assert "as it sets no max_tokens" in bare.json()["error"]["message"]
    logged(4)
    assert sum(row.prompt_tokens + row.completion_tokens for row in RequestLog.objects.all()) == 120

    budget_set(team=team, key=key, tokens_per_month=100_000, user=templated["alice"])
    assert post(gateway, raw, BARE).status_code == 200
    assert provider.seen[-1][3]["max_tokens"] == 4096  # held in full: the answer may not outgrow its hold


def test_a_channel_that_bills_past_the_bound_is_held_for_the_excess_from_then_on(gateway_without_allowances,
                                                                                  templated):
    gateway, team, key, raw = gateway_without_allowances, templated["team"], templated["key"], templated["raw"]
    smol = Channel.objects.get(name="smol")
    budget_set(team=team, key=key, tokens_per_month=10_000, user=templated["alice"])
    warnings = gateway.log().count("its budgets held")
    bare_bound = len(CHAT["messages"][0]["content"])  # 18 bytes, no allowance
    assert post(gateway, raw, CHAT).status_code == 200  # held 18 + 20, billed 35 + 20
    taught = wait_until(lambda: redis.Redis.from_url(settings.REDIS_URL).hget(excess_key(team.pk), str(smol.id)),
                        seconds=10, message="the channel's excess")
    assert int(taught) == REAL_USE - bare_bound - 20 == 17
    wait_until(lambda: gateway.log().count("its budgets held") > warnings, seconds=10, message="the warning")
    assert (f"used {REAL_USE} tokens, more than the {bare_bound + 20} its budgets held: its prompt billed more than "
            f"its bound on channel smol") in gateway.log()

    templated["provider"].chunk_delay = 0.2  # the next request runs long enough to read its hold
    streaming = threading.Thread(target=lambda: httpx.post(
        f"{gateway.url}/v1/chat/completions", json=dict(CHAT, stream=True), timeout=60,
        headers={"Authorization": f"Bearer {raw}"}))
    streaming.start()
    app = f"Key {key}"
    held = wait_until(lambda: {use.name: use for use in budget_usage(team=team)}[app].held_tokens, seconds=20,
                      message="the stream's hold")
    assert held == bare_bound + 17 + 20 == REAL_USE  # what it bills, and no less
    streaming.join(60)
    logged(2)
    assert gateway.log().count("its budgets held") == warnings + 1  # the second request was held for all it used
    assert {use.name: use for use in budget_usage(team=team)}[app].held_tokens == 0


@pytest.mark.django_db(transaction=True)
def test_the_panels_stand_in_key_holds_against_its_team_budget_only(team_setup, monkeypatch):
    """The panel's own requests (Compare, evaluations, shadow tests) are admitted with a stand-in for their team:
    no key id, no limits. It holds against the team's budget, gets no session, and counts no key."""
    team = team_setup["team_a"]
    monkeypatch.setattr(enforcement, "_cache", {})
    budget_set(team=team, tokens_per_month=1000)
    stand_in = SimpleNamespace(id=None, team_id=team.pk, rpm_limit=0, tpm_limit=0, fit_to_budget=False)
    store = redis.Redis.from_url(settings.REDIS_URL)
    team_held = held_keys(month_of(), "team", team.pk)

    async def admitted_then_counted():
        admitted = await admission.admit(stand_in, body=dict(CHAT), headers=[])
        holding = [int(value) for value in store.mget(team_held)]
        await enforcement.count(stand_in, Decimal("0"), REAL_USE, reservation=admitted.reservation)
        return admitted, holding

    admitted, holding = run_coroutine(admitted_then_counted())
    assert holding == [0, prompt_bound(CHAT).tokens + 20]
    assert admitted.session == {} and admitted.session_lookup is None and admitted.budget_spent is None
    assert [int(value) for value in store.mget(team_held)] == [0, 0]
    assert int(store.get(counter_keys(month_of(), "team", team.pk)[1])) == REAL_USE
    assert not [name for name in store.keys("tw:budget:*") if b":key:" in name]

    budget_set(team=team, tokens_per_month=REAL_USE + 100)
    monkeypatch.setattr(enforcement, "_cache", {})
    refused = run_coroutine(admission.admit(stand_in, body=dict(CHAT), headers=[]))
    assert refused.budget_spent.startswith(f"this request may use up to {prompt_bound(CHAT).tokens + 20} tokens")
    assert "this team's monthly budget of 155 tokens has 100 left" in refused.budget_spent
