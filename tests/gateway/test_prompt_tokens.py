"""A prompt's token ids for KV-event placement (gateway/prompt_tokens.py, decisions 0099 and 0101), with a small
real BPE tokenizer (the `tokenizers` package) and a ChatML template that renders tools: the ids are the whole
text's, the chat template is rendered as transformers renders it (its `tojson`), and a hostile body (megabytes in
one message, in many messages, in a tool) is rendered from its leading part only, tokenized in the tokenizing
thread and never on the event loop, within a deadline, with a bounded queue."""
import asyncio
import json
import threading
import types

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from panel.gateway import kv_placement, prompt_tokens
from panel.gateway.kv_index import ReplicaBlocks, prompt_chain
from panel.gateway.prompt_tokens import TOKENIZED_CHARS, Tokenizing, head, load
from tests.support.waiting import run_coroutine, wait_until

CHATML = ("{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
          "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SYSTEM = "You are a careful assistant for the quick brown fox. " * 20
HUGE = 4 * 1024 * 1024  # the gateway's body limit


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = [SYSTEM, "the lazy dog sleeps in the sun while the fox jumps", "tools and their arguments"] * 50
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["[UNK]", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"}))
    return path


@pytest.fixture
def model(folder):
    return load(folder)


def chat(*contents, tools=None):
    body = {"messages": [{"role": "system", "content": SYSTEM}]
            + [{"role": "user", "content": content} for content in contents]}
    if tools is not None:
        body["tools"] = tools
    return body


def test_the_ids_are_the_whole_texts_and_a_repeated_system_prompt_is_tokenized_once(model):
    body = chat("Where does the fox sleep?")
    text = model.text(body)
    assert text.startswith("<|im_start|>system\nYou are") and text.endswith("<|im_start|>assistant\n")
    assert model.ids(body) == model.tokenizer.encode(text, add_special_tokens=False).ids
    assert SYSTEM in model.pieces or any(SYSTEM in piece for piece in model.pieces)
    kept = dict(model.pieces)
    again = model.ids(chat("And the dog?"))
    assert again == model.tokenizer.encode(model.text(chat("And the dog?")), add_special_tokens=False).ids
    assert all(model.pieces[piece] == ids for piece, ids in kept.items())  # the system prompt's piece reused


def test_tools_are_rendered_as_transformers_renders_them(model):
    tools = [{"type": "function", "function": {"name": "lookup", "description": "a <b> & c", "parameters": {}}}]
    text = model.text(chat("hi", tools=tools))
    assert 'Tools: [{"type": "function", "function": {"name": "lookup", "description": "a <b> & c"' in text


@pytest.mark.parametrize("shape", ["one long message", "many messages", "a long tool"])
def test_a_huge_body_is_rendered_from_its_leading_part_and_its_first_chars_are_the_whole_bodys(model, shape):
    filler = "the lazy dog sleeps " * (HUGE // 20)
    if shape == "one long message":
        body = chat(filler)
    elif shape == "many messages":
        body = chat(*["x"] * 200_000)
    else:
        body = chat("hi", tools=[{"type": "function", "function": {"name": "lookup", "description": filler}}])
    text = model.text(body)
    assert len(text) < 3 * TOKENIZED_CHARS, len(text)  # rendered from the head, not the 4 MiB
    if shape != "many messages":  # the whole render, once, to compare with (200,000 messages take seconds)
        whole = prompt_tokens._environment().from_string(CHATML).render(
            messages=body["messages"], tools=body.get("tools"), add_generation_prompt=True)
        assert len(whole) > HUGE and text[:TOKENIZED_CHARS] == whole[:TOKENIZED_CHARS]
    else:
        assert text[:TOKENIZED_CHARS].count("<|im_start|>user\nx<|im_end|>") > 500
    assert len(model.ids(body)) > 1000


def test_the_head_keeps_order_and_cuts_where_its_characters_run_out():
    value = {"a": "12345", "b": ["678", {"c": "9012345"}], "d": "never"}
    # A value counts one, keys and strings their length; past the characters a member keeps its key, emptied.
    assert head(value, 16) == {"a": "12345", "b": ["678", {"c": "90"}], "d": ""}
    assert head(value, 12) == {"a": "12345", "b": ["678"], "d": ""}
    assert len(head({str(index): index for index in range(100_000)}, 50)) < 2 * 50  # a huge map: bounded all the same
    assert head(value, 1000) == value
    assert head(list(range(10_000)), 50) == list(range(49))  # the list itself counts one


@pytest.mark.parametrize("long", [False, True])
def test_a_messages_request_is_tokenized_as_the_chat_request_it_becomes(model, long):
    question = "the lazy dog sleeps " * (HUGE // 20 if long else 1)
    tool = {"name": "lookup", "description": "finds what it is asked for",
            "input_schema": {"type": "object", "properties": {}}}
    messages = {"system": [{"type": "text", "text": SYSTEM}], "max_tokens": 10, "tools": [tool],
                "messages": [{"role": "user", "content": [{"type": "text", "text": question}]}]}
    as_chat = chat(question, tools=[{"type": "function", "function": {  # the order the translation writes
        "name": "lookup", "parameters": tool["input_schema"], "description": tool["description"]}}])
    ids = model.ids(messages, "messages")
    assert ids and ids == model.ids(as_chat)
    assert model.ids({"messages": "not a list"}, "messages") is None


def test_the_prompt_is_tokenized_in_the_tokenizing_thread_never_on_the_event_loop(model, monkeypatch):
    threads = []
    ids = model.ids

    def recorded(body, api):
        threads.append(threading.current_thread().name)
        return ids(body, api)

    monkeypatch.setattr(model, "ids", recorded)
    tokenizing = Tokenizing()

    async def both():
        loop_thread = threading.current_thread().name
        return loop_thread, await tokenizing.ids(model, chat("the fox " * (HUGE // 8)))

    loop_thread, (tokens, trouble) = run_coroutine(both())
    assert trouble == "" and len(tokens) > 1000
    assert threads and threads[0].startswith("tokenize") and threads[0] != loop_thread


class Stuck:
    """A model whose tokenizing waits until released."""

    def __init__(self):
        self.release = threading.Event()
        self.started = threading.Event()

    def ids(self, body, api):
        self.started.set()
        self.release.wait(10)
        return [1, 2, 3]


def test_a_request_waits_for_its_tokens_within_a_deadline_and_the_queue_is_bounded(monkeypatch):
    monkeypatch.setattr(prompt_tokens, "ENCODE_SECONDS", 0.05)
    monkeypatch.setattr(prompt_tokens, "QUEUED_AT_MOST", 2)
    tokenizing, stuck = Tokenizing(), Stuck()

    async def three():
        first = asyncio.create_task(tokenizing.ids(stuck, {}))  # runs, past the deadline
        await asyncio.to_thread(stuck.started.wait, 5)
        second = asyncio.create_task(tokenizing.ids(stuck, {}))  # queued behind it, past the deadline
        await asyncio.sleep(0)
        third = await tokenizing.ids(stuck, {})  # two waiting: not queued at all, answered at once
        return await first, await second, third

    first, second, third = run_coroutine(three())
    assert first == (None, "its prompt was not tokenized within 50 ms")
    assert second == (None, "its prompt was not tokenized within 50 ms")
    assert third == (None, "2 prompts are waiting for the gateway's tokenizer")
    assert tokenizing.queued == 1  # the first, still in the thread; the second left the queue at its deadline
    stuck.release.set()
    wait_until(lambda: tokenizing.queued == 0, seconds=5, message="the queue emptied")
    assert run_coroutine(tokenizing.ids(stuck, {})) == ([1, 2, 3], "")


def test_a_prompt_its_client_stopped_waiting_for_is_taken_out_of_the_queue(monkeypatch):
    tokenizing, stuck, ran = Tokenizing(), Stuck(), []

    async def leave():
        running = asyncio.create_task(tokenizing.ids(stuck, {}))
        await asyncio.to_thread(stuck.started.wait, 5)
        queued = asyncio.create_task(tokenizing.ids(types.SimpleNamespace(ids=lambda body, api: ran.append(body)), {}))
        await asyncio.sleep(0.01)
        queued.cancel()  # its client left before the thread reached it
        await asyncio.sleep(0.05)  # the cancel reaches the queue on the loop's next turns
        stuck.release.set()
        return await running

    assert run_coroutine(leave()) == ([1, 2, 3], "")
    wait_until(lambda: tokenizing.queued == 0, seconds=5, message="the queue emptied")
    assert ran == []


def test_a_huge_request_is_placed_by_the_replica_holding_its_prompt(folder, model, monkeypatch):
    """Through kv_choice: a 4 MiB body whose leading blocks one replica's engine holds goes there."""
    monkeypatch.setattr(prompt_tokens.TOKENIZERS, "_models", {str(folder): model})
    body = chat("the lazy dog sleeps " * (HUGE // 20))
    tokens = model.ids(body)
    near, far = ReplicaBlocks(), ReplicaBlocks()
    for blocks in (near, far):
        blocks.heard_at, blocks.block_size = 1e12, 16
    far.held.update(prompt_chain(tokens, 16)[:40])
    near.held.update(prompt_chain(tokens, 16)[:3])
    indexes = {"ipc://near": near, "ipc://far": far}
    monkeypatch.setattr(kv_placement, "KV_EVENTS", types.SimpleNamespace(
        blocks=lambda endpoint, replay: indexes[endpoint], silence=lambda blocks, now: ""))
    pool = [types.SimpleNamespace(name=name, id=index, kv_events=f"ipc://{name}", kv_replay="",
                                  tokenizer_dir=str(folder)) for index, name in enumerate(("near", "far"))]
    choice = run_coroutine(kv_placement.kv_choice(pool, body))
    assert (choice.index, choice.outcome, choice.blocks) == (1, "kv_placed", (3, 40)), choice

