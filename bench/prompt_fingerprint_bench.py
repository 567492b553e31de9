"""What the gateway's system prompt hashing costs per request on this machine (not a test; results in
docs/benchmarks.md).

  .venv/bin/python bench/prompt_fingerprint_bench.py [--rounds 2000]

It runs on the event loop for every chat request with a system prompt (panel/gateway/fingerprint.py): a prompt
seen before costs one HMAC and a dictionary look-up; a prompt that changes every time (a timestamp in it) is
masked first. Printed: microseconds per request, median of five runs, for 2 KB and 16 KB prompts of both kinds."""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from panel.gateway import fingerprint  # noqa: E402

SENTENCE = "Answer politely, cite the order number when relevant, and never promise a refund yourself. "


def prompt(size, index):
    head = f"You are the support assistant of ACME. Now: 2026-11-30T05:{index % 60:02d}:{index % 59:02d}Z. " \
           f"The user is Customer{index} Smith, session {index:08x}-1111-2222-3333-444455556666. "
    return head + SENTENCE * (size // len(SENTENCE))


def per_request_us(size, *, dynamic, rounds):
    bodies = [{"messages": [{"role": "system", "content": prompt(size, index if dynamic else 0)},
                            {"role": "user", "content": "hello"}]} for index in range(rounds)]
    fingerprint._shapes.clear()
    fingerprint.system_prompt_hashes(bodies[0])
    started = time.perf_counter()
    for body in bodies:
        fingerprint.system_prompt_hashes(body)
    return (time.perf_counter() - started) / rounds * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    print("| system prompt | seen before (µs) | changes every request (µs) |")
    print("| --- | --- | --- |")
    for size in (2048, 16384):
        rounds = args.rounds if size <= 4096 else max(1, args.rounds // 8)
        same = statistics.median(per_request_us(size, dynamic=False, rounds=rounds) for _ in range(5))
        changing = statistics.median(per_request_us(size, dynamic=True, rounds=rounds) for _ in range(5))
        print(f"| {size // 1024} KB | {same:.0f} | {changing:.0f} |")
    # Agent sessions hash every prompt's prefix blocks (one running HMAC over the whole prompt, every request).
    print()
    print("| agent prompt (tools, system, messages) | prefix-block hashes (µs) |")
    print("| --- | --- |")
    for turns in (5, 20, 60):
        body = agent_body(turns)
        rounds = max(20, args.rounds // turns)
        took = statistics.median(prefix_us(body, rounds) for _ in range(5))
        size = sum(len(block) for block in fingerprint.prompt_blocks(body))
        print(f"| {turns} turns, {size // 1024} KB | {took:.0f} |")


def agent_body(turns):
    messages = [{"role": "system", "content": SENTENCE * 20}, {"role": "user", "content": "Review main.py"}]
    for turn in range(turns):
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{turn}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": f"def f{turn}(): pass\n" * 40}]
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    return {"messages": messages, "tools": tools}


def prefix_us(body, rounds):
    started = time.perf_counter()
    for _ in range(rounds):
        fingerprint.prefix_hashes(body)
    return (time.perf_counter() - started) / rounds * 1e6


if __name__ == "__main__":
    main()
