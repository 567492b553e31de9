"""What placing a request by the engines' KV events costs on the gateway's loop (decision 0099; a script, not a
test): `kv_choice` over two replicas whose indexes hold 8 tenants' system prompts, for chat requests whose system
prompt each process has seen (its text tokenized once and kept) with a fresh user turn, and the same with a system
prompt never seen (tokenized whole). CPU time of the calling thread per request.

    .venv/bin/python -m bench.kv_placement_bench [--model DIR] [--requests 2000]
"""
import argparse
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
        placed = 0
        started = time.thread_time()
        for item in bodies:
            placed += kv_placement.kv_choice(pool, item).index is not None
        per = (time.thread_time() - started) / len(bodies) * 1e6
        tokens = len(model.ids(bodies[0]))
        print(f"{label}: {per:.0f} us CPU per request ({tokens} prompt tokens, {placed}/{len(bodies)} placed)")


if __name__ == "__main__":
    main()
