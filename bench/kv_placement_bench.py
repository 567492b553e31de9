"""What placing a request by the engines' KV events costs the gateway (decisions 0099 and 0101; a script, not a
test): `kv_choice` over two replicas whose indexes hold 8 tenants' system prompts, for chat requests whose system
prompt each process has seen (its text tokenized once and kept) with a fresh user turn, and the same with a system
prompt never seen (tokenized whole). Per request, one after another: the CPU time of the event loop's thread (what
holds other requests back), of the whole process (the tokenizing thread's included) and the wall time.

    .venv/bin/python -m bench.kv_placement_bench [--model DIR] [--requests 2000]
"""
import argparse
import asyncio
import random
import time
from types import SimpleNamespace

from bench import replica_bench as rb
from panel.gateway import kv_placement
from panel.gateway.kv_events import KV_EVENTS, Stream
from panel.gateway.kv_index import prompt_chain
from panel.gateway.prompt_tokens import TOKENIZERS, load


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--system-words", type=int, default=700, help="about 1,000 tokens of the demo model")
    args = parser.parse_args()
    path = str(args.model or rb.demo_model_path())
    model = load(path)
    TOKENIZERS._models[path] = model
    pool = []
    for index in range(2):  # two replicas, their indexes filled as their events would (no sockets)
        endpoint = f"ipc:///nowhere/{index}"
        stream = Stream(endpoint, endpoint + "-replay")
        stream.blocks.heard_at, stream.blocks.block_size = time.monotonic() + 3600, 32
        KV_EVENTS.streams[endpoint] = stream
        pool.append(SimpleNamespace(name=f"replica-{index}", id=index, kv_events=endpoint,
                                    kv_replay=endpoint + "-replay", tokenizer_dir=path))
    systems = [rb.words(random.Random(tenant), args.system_words) for tenant in range(8)]
    for tenant, system in enumerate(systems):
        tokens = model.ids({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "x"}]})
        KV_EVENTS.streams[pool[tenant % 2].kv_events].blocks.held.update(prompt_chain(tokens, 32)[:-1])
    rng = random.Random(1)

    def body(system):
        return {"model": "m", "messages": [{"role": "system", "content": system},
                                           {"role": "user", "content": rb.words(rng, 24)}]}

    for label, make in (("seen system prompt", lambda i: body(systems[i % 8])),
                        ("new system prompt", lambda i: body(rb.words(random.Random(10_000 + i), args.system_words)))):
        bodies = [make(i) for i in range(args.requests)]
        placed, loop_cpu, process_cpu, wall = asyncio.run(place_all(pool, bodies))
        tokens = len(model.ids(bodies[0]))
        count = len(bodies)
        print(f"{label}: {loop_cpu / count * 1e6:.0f} us of the loop's CPU, {process_cpu / count * 1e6:.0f} us of the "
              f"process's, {wall / count * 1e6:.0f} us wall per request ({tokens} prompt tokens, {placed}/{count} "
              "placed)")


async def place_all(pool, bodies):
    placed = 0
    loop_started, process_started, wall_started = time.thread_time(), time.process_time(), time.perf_counter()
    for item in bodies:
        placed += (await kv_placement.kv_choice(pool, item)).index is not None
    return (placed, time.thread_time() - loop_started, time.process_time() - process_started,
            time.perf_counter() - wall_started)

if __name__ == "__main__":
    main()
