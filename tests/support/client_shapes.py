"""Captured request shapes of real clients (tests/support/fixtures/clients/): what a current coding agent sends,
kept as keys, types and sizes, never its words or identifiers. `shape_of(body)` turns a captured body into one:
every text and description becomes filler of the same length (so token counts and limits stay realistic), ids
and the metadata's device and account become fixed placeholders; keys, block types, cache_control marks, tool
names and their input schemas stay as sent.

    python -m tests.support.client_shapes CAPTURED.json NAME   # writes fixtures/clients/NAME.json
"""
import json
import sys
from pathlib import Path

FOLDER = Path(__file__).parent / "fixtures" / "clients"
FILLER = "Context for the agent: files, rules and reminders. "
TEXT_KEYS = ("text", "description", "content", "thinking")


def filler(length):
    return (FILLER * (length // len(FILLER) + 1))[:length]


def shape_of(value, key=None):
    if isinstance(value, dict):
        return {name: shape_of(item, name) for name, item in value.items()}
    if isinstance(value, list):
        return [shape_of(item, key) for item in value]
    if isinstance(value, str) and key in TEXT_KEYS:
        return filler(len(value))
    if isinstance(value, str) and key == "user_id":
        return json.dumps({"device_id": "0" * 64, "account_uuid": "",
                           "session_id": "00000000-0000-4000-8000-000000000001"})
    return value


def load(name):
    """A fixture's {"client", "path", "headers", "body"}."""
    return json.loads((FOLDER / f"{name}.json").read_text())


def main(argv):
    captured, name = Path(argv[0]), argv[1]
    data = json.loads(captured.read_text())
    FOLDER.mkdir(parents=True, exist_ok=True)
    (FOLDER / f"{name}.json").write_text(json.dumps(shape_of(data), indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
