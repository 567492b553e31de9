"""Captured request shapes of real clients (tests/support/fixtures/clients/): what a current client sends, kept as
keys, types and sizes, never its words or identifiers. `shape_of(body)` turns a captured body into one: every text
and description becomes filler of the same length (so token counts and limits stay realistic: `text`, `content`,
`thinking`, a `system` prompt, the Responses API's `input` and `instructions` when they are strings, a tool result's
`output`), ids become numbered placeholders that keep their prefix (`msg_…` → `msg_01`; a call and its result keep
one id between them), and what names a device, an account or a session (Claude Code's `metadata.user_id`, Codex's
`prompt_cache_key` and `client_metadata`) becomes fixed placeholders; keys, block and item types, cache_control
marks, tool names and their input schemas, and a tool call's arguments stay as sent.

A capture is what a listener recorded of one request: {"path", "headers", "body"}. Its headers are kept only where
they say which client and API version wrote the body (`KEPT_HEADERS`); keys and session ids are left behind. The
fixtures of 2026-12-04 were recorded by a small HTTP listener that answered each API in kind (a tool call first, so
the client's second turn carries its result), the CLIs run under `unshare -n` with only loopback, so they could
reach nothing else.

    python -m tests.support.client_shapes CAPTURED.json NAME "CLIENT AND HOW IT WAS RUN"
"""
import json
import re
import sys
from pathlib import Path

FOLDER = Path(__file__).parent / "fixtures" / "clients"
FILLER = "Context for the agent: files, rules and reminders. "
TEXT_KEYS = ("text", "description", "content", "thinking", "system", "input", "instructions", "output")
ID_KEYS = ("id", "call_id", "tool_use_id", "tool_call_id")
SESSION = "00000000-0000-4000-8000-000000000001"
KEPT_HEADERS = ("user-agent", "x-stainless-package-version", "anthropic-beta", "anthropic-version", "x-app",
                "originator", "openai-beta", "x-codex-beta-features")


def filler(length):
    return (FILLER * (length // len(FILLER) + 1))[:length]


def shape_of(value, key=None, ids=None):
    """`value` with its words, ids and session facts replaced (see the module's docstring); `ids` maps each id
    seen to its placeholder, so references between them stay right."""
    ids = {} if ids is None else ids
    if key == "client_metadata" and isinstance(value, dict):
        return {name: "placeholder" for name in value}
    if isinstance(value, dict):
        return {name: shape_of(item, name, ids) for name, item in value.items()}
    if isinstance(value, list):
        return [shape_of(item, key, ids) for item in value]
    if not isinstance(value, str):
        return value
    if key in TEXT_KEYS:
        return filler(len(value))
    if key in ID_KEYS:
        if value not in ids:
            prefix = re.match(r"[a-z]+[_-]", value)
            ids[value] = f"{prefix.group(0) if prefix else ''}{len(ids) + 1:02d}"
        return ids[value]
    if key == "user_id":
        return json.dumps({"device_id": "0" * 64, "account_uuid": "", "session_id": SESSION})
    if key == "prompt_cache_key":
        return SESSION
    return value


def fixture_of(captured, client):
    """A fixture's {"client", "path", "headers", "body"} from a listener's capture."""
    headers = {name.lower(): value for name, value in captured["headers"].items()}
    return {"client": client, "path": captured["path"],
            "headers": {name: headers[name] for name in KEPT_HEADERS if name in headers},
            "body": shape_of(captured["body"])}


def load(name):
    """A fixture's {"client", "path", "headers", "body"}."""
    return json.loads((FOLDER / f"{name}.json").read_text())


def main(argv):
    captured, name, client = Path(argv[0]), argv[1], argv[2]
    FOLDER.mkdir(parents=True, exist_ok=True)
    fixture = fixture_of(json.loads(captured.read_text()), client)
    (FOLDER / f"{name}.json").write_text(json.dumps(fixture, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
