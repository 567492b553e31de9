"""What one replica's KV cache holds, by its engine's own events (vLLM's `--kv-events-config`, decision 0099).

vLLM publishes, per engine step, a batch `[ts, events, dp_rank]` (msgpack): `BlockStored` (the engine's hashes of
the blocks, the parent block's hash, their token ids, the block size), `BlockRemoved` (hashes) and
`AllBlocksCleared`. The engine's own hashes depend on its hash seed, which the gateway cannot compute; so each
stored block is indexed by a chain key of our own over the same token ids (the parent's key and the block's
tokens), which the gateway computes for a request's prompt the same way. A block whose parent the index does not
know (events missed), or that carries extra keys (a LoRA adapter, a cache salt, images), is left out: the index may
know less than the engine, never more, except for removals it missed, which a sequence gap clears."""
import hashlib
import time
from array import array

import msgspec

EMPTY = b""


def chain_key(parent, tokens):
    """The key of a block: its parent's key and its own token ids."""
    return hashlib.blake2b(parent + array("I", tokens).tobytes(), digest_size=16).digest()


def prompt_chain(tokens, block_size):
    """The chain keys of a prompt's whole blocks, first to last."""
    keys, parent = [], EMPTY
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = chain_key(parent, tokens[start:start + block_size])
        keys.append(parent)
    return keys


class BatchDecoder:
    """Decodes a published batch into plain lists and dicts (no vLLM classes needed)."""

    def __init__(self):
        self._decoder = msgspec.msgpack.Decoder()

    def decode(self, payload):
        batch = self._decoder.decode(payload)
        return batch[1] if isinstance(batch, list) and len(batch) >= 2 else []


def _event_fields(event):
    """(kind, fields) of one event: vLLM encodes its tagged structs as arrays `[tag, field, ...]` in the field
    order of the class."""
    if isinstance(event, dict):
        return event.get("type"), event
    if isinstance(event, list) and event:
        kind = event[0]
        if kind == "BlockStored":
            names = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                     "lora_name", "extra_keys")
        elif kind == "BlockRemoved":
            names = ("block_hashes", "medium")
        else:
            names = ()
        return kind, dict(zip(names, event[1:]))
    return None, {}


def _engine_hash(value):
    return bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else value


class ReplicaBlocks:
    """The blocks one engine holds, kept by its event stream; read by the gateway's loop, written by the
    subscriber's thread (a set's membership test and add are atomic under the GIL)."""

    def __init__(self):
        self.keys = {}  # the engine's block hash -> our chain key
        self.held = set()  # chain keys of the blocks the engine holds
        self.block_size = None
        self.seq = -1  # the last batch applied
        self.heard_at = None  # monotonic time of the last batch or heartbeat answer
        self.started_at = time.monotonic()
        self.lost, self.lost_at = "", 0.0  # a gap the engine could not replay (the index was cleared), and when
        self.gaps = 0
        self.stored = self.removed = self.cleared = 0  # blocks, since the subscriber started

    def clear(self):
        self.keys.clear()
        self.held.clear()

    def apply(self, events):
        for event in events:
            kind, fields = _event_fields(event)
            if kind == "BlockStored":
                self._stored(fields)
            elif kind == "BlockRemoved":
                for value in fields.get("block_hashes") or ():
                    key = self.keys.pop(_engine_hash(value), None)
                    if key is not None:
                        self.held.discard(key)
                        self.removed += 1
            elif kind == "AllBlocksCleared":
                self.clear()
                self.cleared += 1

    def _stored(self, fields):
        if fields.get("lora_name") or fields.get("lora_id") or any(fields.get("extra_keys") or ()):
            return
        size, tokens = fields.get("block_size"), fields.get("token_ids") or []
        hashes = fields.get("block_hashes") or []
        if not size or len(tokens) != size * len(hashes):
            return  # a partial block (another group's size): not a whole block of the index's size
        parent_hash = fields.get("parent_block_hash")
        if parent_hash is None:
            parent = EMPTY
        else:
            parent = self.keys.get(_engine_hash(parent_hash))
            if parent is None:
                return  # its parent was never seen: its chain cannot be known
        if self.block_size is None:
            self.block_size = size
        elif size != self.block_size:
            return
        for index, value in enumerate(hashes):
            parent = chain_key(parent, tokens[index * size:(index + 1) * size])
            self.keys[_engine_hash(value)] = parent
            if parent not in self.held:
                self.held.add(parent)
                self.stored += 1

    def matched(self, chain):
        """How many leading blocks of a prompt's chain this engine holds."""
        held = self.held
        count = 0
        for key in chain:
            if key not in held:
                break
            count += 1
        return count
