"""Which replica holds the longest prefix of a request's prompt, by its engine's own KV-cache events (a route
balanced `kv_events`, decision 0099): the prompt's token ids (gateway/prompt_tokens.py) as chain keys of whole
blocks, matched against each replica's index (gateway/kv_events.py). One replica holding more blocks than every
other places the request; a tie or no block at all leaves it to the prefix-aware rule, and so does a replica
whose events stopped (every replica's index must be heard from, else a silent one would always look empty). The
request's trail gets one step saying which it was."""
import time
from dataclasses import dataclass

from panel.gateway.kv_events import KV_EVENTS
from panel.gateway.prompt_tokens import TOKENIZERS, TOKENIZING

PLACED, MISSED, FALLBACK = "kv_placed", "kv_missed", "kv_fallback"  # the trail step's outcomes


@dataclass(frozen=True)
class KvChoice:
    index: int | None  # the replica (in the pool) whose engine holds the longest prefix, None: the prefix rule
    outcome: str
    words: str
    blocks: tuple = ()  # leading blocks of the prompt each replica holds


async def kv_choice(pool, body, api="chat"):
    """The KvChoice for one request over the pool's targets. Its prompt is tokenized off the event loop, within a
    deadline (gateway/prompt_tokens.py)."""
    model = TOKENIZERS.get(pool[0].tokenizer_dir)  # first: its loading starts with the subscriptions
    indexes = []
    for target in pool:
        if not target.kv_events:
            return KvChoice(None, FALLBACK, f"{target.name} publishes no KV events: placed by prefix")
        indexes.append(KV_EVENTS.blocks(target.kv_events, target.kv_replay))
    now = time.monotonic()
    for target, blocks in zip(pool, indexes):
        silence = KV_EVENTS.silence(blocks, now)
        if silence:
            return KvChoice(None, FALLBACK, f"KV events of {target.name}: {silence}; placed by prefix")
    if model is None:
        return KvChoice(None, FALLBACK, "the model's tokenizer is not loaded (yet): placed by prefix")
    sizes = {blocks.block_size for blocks in indexes if blocks.block_size}
    if not sizes:
        return KvChoice(None, MISSED, "no engine holds this prompt's first block: placed by prefix",
                        (0,) * len(indexes))
    chains, trouble = await TOKENIZING.chains(model, body, api, sizes)
    if trouble:
        return KvChoice(None, FALLBACK, f"{trouble}: placed by prefix")
    if chains is None:
        return KvChoice(None, FALLBACK, "a prompt the gateway does not tokenize: placed by prefix")
    matched = [blocks.matched(chains[blocks.block_size]) if blocks.block_size else 0 for blocks in indexes]
    best = max(matched)
    if best == 0:
        return KvChoice(None, MISSED, "no engine holds this prompt's first block: placed by prefix",
                        tuple(matched))
    if matched.count(best) > 1:
        return KvChoice(None, MISSED, f"{matched.count(best)} engines hold its first {best} blocks: placed by prefix",
                        tuple(matched))
    index = matched.index(best)
    return KvChoice(index, PLACED, f"its engine holds the prompt's first {best} blocks "
                                   f"({', '.join(str(count) for count in matched)} by replica)", tuple(matched))
