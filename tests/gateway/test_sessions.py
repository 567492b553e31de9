"""Agent sessions: by the x-session-id header, by Anthropic metadata.user_id, by prefix chaining (a prompt that
extends an earlier one of the same key); the repeated share from keyed prefix-block hashes; the keyed hash of a
prompt's head, which the Cache tab reads; no prompt text stored."""
import json

import httpx

from panel.gateway import fingerprint
from panel.gateway.sessions import declared_session, user_session_id
from panel.usage.models import RequestLog
from tests.support import client_shapes
from tests.support.gateway import CHAT, fallback, gateway, primary, records, setup  # noqa: F401 (fixtures)

SYSTEM = {"role": "system", "content": "You review code. Secret marker: pelican-4471. " * 20}
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def post(gateway, raw, body, headers=None):
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {raw}", **(headers or {})})


def turns(count):
    """The growing prompts of an agent: each turn re-sends everything before and adds a tool call and its result."""
    messages, bodies = [SYSTEM, {"role": "user", "content": "Review the diff in main.py"}], []
    for turn in range(count):
        bodies.append({**CHAT, "messages": list(messages), "tools": TOOLS})
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{turn}", "type": "function", "function": {"name": "read_file",
                                                                    "arguments": f"{{\"path\": \"f{turn}.py\"}}"}}]},
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": f"def f{turn}(): return {turn}\n" * 30}]
    return bodies


def test_prefix_hashes_chain_and_compare_blocks():
    first, second, _ = turns(3)
    hashes_1, ends_1 = fingerprint.prefix_hashes(first)
    hashes_2, ends_2 = fingerprint.prefix_hashes(second)
    assert len(hashes_1) == 3 and len(hashes_2) == 5  # tools, system, user (+ the assistant's call, the result)
    assert hashes_2[:3] == hashes_1 and ends_2[:3] == ends_1
    assert fingerprint.shared_blocks(hashes_2, hashes_1) == 3
    changed = {**second, "messages": [{"role": "system", "content": "other"}, *second["messages"][1:]]}
    assert fingerprint.shared_blocks(fingerprint.prefix_hashes(changed)[0], hashes_2) == 1  # the tools only
    anthropic = {"system": [{"type": "text", "text": "You review code."}], "tools": [{"name": "t", "input_schema": {}}],
                 "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert len(fingerprint.prefix_hashes(anthropic)[0]) == 3
    assert len(fingerprint.prefix_hashes({"prompt": "x" * 5000})[0]) == 3


def test_a_responses_conversation_chains_by_its_instructions_and_input_items_and_embeddings_stay_out():
    # Codex sends its instructions as developer items, then the user's turn; its second request extends the first.
    first = client_shapes.load("codex_0_171_0")["body"]
    second = client_shapes.load("codex_0_171_0_tool_turn")["body"]
    hashes_1, _ = fingerprint.prefix_hashes(first)
    hashes_2, _ = fingerprint.prefix_hashes(second)
    assert len(hashes_1) == 1 + len(first["input"]) and fingerprint.shared_blocks(hashes_2, hashes_1) == len(hashes_1)
    other_run = {**first, "input": [*first["input"][:-1], {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Fix the failing test"}]}]}
    assert fingerprint.shared_blocks(fingerprint.prefix_hashes(other_run)[0], hashes_1) == len(hashes_1) - 1
    developer = [part["text"] for item in first["input"][:2] for part in item["content"]]
    assert fingerprint.system_prompt(first) == "\n".join(developer)
    # The OpenAI SDK's string input after its instructions: a turn of its own, its system prompt the instructions.
    sdk = client_shapes.load("openai_python_3_57_0_responses")["body"]
    assert fingerprint.system_prompt(sdk) == sdk["instructions"]
    assert fingerprint.prompt_blocks(sdk)[1:] == [sdk["instructions"], sdk["input"]]
    for embeddings in ({"input": "one two"}, {"input": ["one", "two"]}, {"input": [[1, 2, 3]]}):
        assert fingerprint.prefix_hashes(embeddings) == ([], []) and not fingerprint.system_prompt(embeddings)


def test_a_client_names_its_session_by_header_or_metadata():
    assert declared_session({}, [(b"X-Session-Id", b"review-42")]) == "review-42"
    by_user = declared_session({"metadata": {"user_id": "user_abc_session_9"}}, [])  # a user id by its keyed hash
    assert by_user == user_session_id("user_abc_session_9") and by_user.startswith("u-") and len(by_user) == 34
    assert declared_session({"metadata": {"user_id": "u"}}, [(b"x-session-id", b"h")]) == "h"  # the header first
    long = declared_session({}, [(b"x-session-id", b"x" * 300)])
    assert len(long) == 64 and long != declared_session({}, [(b"x-session-id", b"x" * 299 + b"y")])
    assert declared_session({"metadata": "nope"}, []) == ""


def test_requests_join_sessions_by_header_metadata_and_prefix(gateway, setup, primary):
    headers = {"x-session-id": "review-42"}
    assert post(gateway, setup["raw"], CHAT, headers=headers).status_code == 200
    assert post(gateway, setup["raw"], {**CHAT, "messages": [{"role": "user", "content": "other"}]},
                headers=headers).status_code == 200
    with_metadata = {**CHAT, "metadata": {"user_id": "user_7_session_x"}}
    assert post(gateway, setup["raw"], with_metadata).status_code == 200
    for body in turns(3):
        assert post(gateway, setup["raw"], body).status_code == 200
    assert post(gateway, setup["raw"], {**CHAT, "messages": [{"role": "user", "content": "unrelated"}]}).status_code \
        == 200
    rows = records(7)
    assert [(row.session_id, row.session_turn) for row in rows[:3]] == [
        ("review-42", 1), ("review-42", 2), (user_session_id("user_7_session_x"), 1)]
    chained = rows[3:6]
    assert len({row.session_id for row in chained}) == 1 and chained[0].session_id.startswith("p-")
    assert [row.session_turn for row in chained] == [1, 2, 3]
    assert chained[0].repeated_share == 0
    assert 0.4 < chained[1].repeated_share < 0.95 and chained[2].repeated_share > chained[1].repeated_share
    _, ends = fingerprint.prefix_hashes(turns(2)[1])
    assert abs(chained[1].repeated_share - ends[2] / ends[-1]) < 0.001
    assert rows[6].session_id not in {chained[0].session_id, ""} and rows[6].session_turn == 1


DOCUMENT = "Clause {n}. The supplier delivers the goods within thirty days of the order. " * 30


def test_the_head_hash_is_the_prompts_first_characters_wherever_the_shared_text_sits():
    def asking(document, question, system=None):
        messages = [{"role": "user", "content": document + "\n\n" + question}]
        return {**CHAT, "messages": ([{"role": "system", "content": system}] if system else []) + messages}

    one, other = DOCUMENT.format(n=1), DOCUMENT.format(n=2)
    head = fingerprint.prompt_head_hash
    assert head(asking(one, "Who delivers?")) == head(asking(one, "Within how many days?"))
    assert head(asking(one, "Who delivers?")) != head(asking(other, "Who delivers?"))
    assert head(asking(one, "Who delivers?", system="Be brief.")) != head(asking(one, "Who delivers?"))
    assert head(asking("short", "a")) != head(asking("short", "b"))  # a short prompt is hashed whole
    assert head({"model": "m", "prompt": one + "A"}) == head({"model": "m", "prompt": one + "B"})
    assert head({"model": "m", "input": "embed me"}) == ""
    tools = {**asking("x", "y"), "tools": [{"type": "function", "function": {"name": "n" * 2000}}]}
    assert head(tools) == head({**tools, "messages": [{"role": "user", "content": "other"}]})  # the tools fill it
    assert len(head(asking(one, "q"))) == fingerprint.HASH_CHARS


def test_the_head_hash_writes_out_only_the_head_of_a_long_tools_list(monkeypatch):
    tools = [{"type": "function", "function": {"name": f"tool_{n}", "description": "d" * 300}} for n in range(5000)]
    body = {**CHAT, "tools": tools}
    whole = json.dumps(tools, sort_keys=True, ensure_ascii=False)
    for chars in (1, 10, 400, 1024, len(whole) - 1, len(whole), len(whole) + 5):
        assert whole.startswith(fingerprint._tools_json(tools, chars)[:chars])
    assert fingerprint._tools_json(tools[:2], 10_000) == json.dumps(tools[:2], sort_keys=True, ensure_ascii=False)
    expected = head_hash_by_hand(whole + "\x00" + fingerprint._message_block(CHAT["messages"][0]))
    written = []
    real_dumps = json.dumps
    monkeypatch.setattr(fingerprint.json, "dumps", lambda value, **options: written.append(
        real_dumps(value, **options)) or written[-1])
    assert fingerprint.prompt_head_hash(body) == expected
    assert sum(map(len, written)) < 2 * fingerprint.HEAD_CHARS  # four tools of 5,000, not the list


def head_hash_by_hand(text):
    import hashlib
    import hmac
    head = text[:fingerprint.HEAD_CHARS]
    return hmac.new(fingerprint._prefix_key(), b"head:" + head.encode() + b"\x00",
                    hashlib.sha256).hexdigest()[:fingerprint.HASH_CHARS]


def test_requests_opening_with_the_same_document_are_stored_with_one_head_hash(gateway, setup, primary):
    for document, question in ((1, "Who delivers?"), (1, "Within how many days?"), (2, "Who delivers?")):
        body = {**CHAT, "messages": [{"role": "user", "content": DOCUMENT.format(n=document) + question}]}
        assert post(gateway, setup["raw"], body).status_code == 200
    rows = records(3)
    assert rows[0].prompt_head_hash == rows[1].prompt_head_hash != rows[2].prompt_head_hash
    assert {row.system_prompt_hash for row in rows} == {""}


def test_no_prompt_text_is_stored(gateway, setup, primary):
    for body in turns(2):
        assert post(gateway, setup["raw"], body).status_code == 200
    records(2)
    for row in RequestLog.objects.values():
        stored = " ".join(str(value) for value in row.values())
        assert "pelican-4471" not in stored and "Review the diff" not in stored and "def f0" not in stored
