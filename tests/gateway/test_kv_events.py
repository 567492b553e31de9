"""The index of what a replica's engine holds, kept from vLLM's KV-cache events (decision 0099): batches encoded as
vLLM 0.32 encodes them (msgpack `[ts, [events], dp_rank]`, each event a map with its `type`, as the real engine was
seen to send; tests/system/test_replicas_engine.py places by a real engine's). Chains of blocks by their token ids,
a block whose parent is unknown left out, removals and a clear, adapters' blocks left out; and the subscriber's
sequence handling against a publisher speaking vLLM's framing (topic, 8-byte sequence, payload; replay by a ROUTER
answering from a start sequence, then an end marker): a gap filled by replay, a gap the engine no longer buffers,
an engine started again, and a stream that goes quiet."""
import time

import msgspec
import pytest
import zmq

from panel.gateway import kv_events
from panel.gateway.kv_events import END_SEQ, KvEvents
from panel.gateway.kv_index import BatchDecoder, ReplicaBlocks, prompt_chain
from tests.support.waiting import wait_until

BLOCK = 4
ENCODER = msgspec.msgpack.Encoder()


def stored(hashes, tokens, parent=None, **extra):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": BLOCK, "lora_id": None, "medium": "GPU", "lora_name": None, **extra}


def removed(hashes):
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def batch(*events):
    return ENCODER.encode([time.time(), list(events), 0])


def apply(blocks, *events):
    blocks.apply(BatchDecoder().decode(batch(*events)))


PROMPT = list(range(100, 114))  # three whole blocks of 4 and two tokens over


def test_a_chain_of_stored_blocks_matches_the_prompts_leading_blocks():
    blocks = ReplicaBlocks()
    apply(blocks, stored([11, 12], PROMPT[:8]))
    chain = prompt_chain(PROMPT, BLOCK)
    assert len(chain) == 3 and blocks.block_size == BLOCK
    assert blocks.matched(chain) == 2
    apply(blocks, stored([13], PROMPT[8:12], parent=12))  # a child stored later, by its parent's engine hash
    assert blocks.matched(chain) == 3
    other = [1, 2, 3, 4] + PROMPT[4:]  # the same later tokens after another first block: no match at all
    assert blocks.matched(prompt_chain(other, BLOCK)) == 0


def test_a_block_whose_parent_was_never_seen_or_that_an_adapter_made_is_left_out():
    blocks = ReplicaBlocks()
    apply(blocks, stored([13], PROMPT[8:12], parent=12))
    apply(blocks, stored([11], PROMPT[:4], lora_name="shout"))
    apply(blocks, stored([21], PROMPT[:4], extra_keys=[["salt"]]))
    assert blocks.held == set() and blocks.matched(prompt_chain(PROMPT, BLOCK)) == 0


def test_removed_blocks_and_a_clear_leave_the_index():
    blocks = ReplicaBlocks()
    apply(blocks, stored([11, 12, 13], PROMPT[:12]))
    apply(blocks, removed([12]))
    assert blocks.matched(prompt_chain(PROMPT, BLOCK)) == 1 and blocks.removed == 1
    apply(blocks, {"type": "AllBlocksCleared"})
    assert blocks.held == set() and blocks.matched(prompt_chain(PROMPT, BLOCK)) == 0


class Publisher:
    """vLLM's ZmqEventPublisher's sockets and framing: PUB (topic, seq, payload) and a ROUTER that answers a
    replay request with every buffered batch from the asked sequence, then END_SEQ."""

    def __init__(self, tmp_path, name="engine"):
        self.context = zmq.Context()
        self.endpoint, self.replay = f"ipc://{tmp_path}/{name}.sock", f"ipc://{tmp_path}/{name}-replay.sock"
        self.pub = self.context.socket(zmq.PUB)
        self.pub.bind(self.endpoint)
        self.router = self.context.socket(zmq.ROUTER)
        self.router.bind(self.replay)
        self.buffer, self.seq = [], 0
        self.answering = True

    def publish(self, *events, buffered=True):
        payload = batch(*events)
        self.pub.send_multipart([b"", self.seq.to_bytes(8, "big"), payload])
        if buffered:
            self.buffer.append((self.seq, payload))
        self.seq += 1

    def skip(self, *events):
        """A batch the subscriber never gets live (dropped past the high-water mark), still in the buffer."""
        self.buffer.append((self.seq, batch(*events)))
        self.seq += 1

    def serve(self, seconds=0.3):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.answering and self.router.poll(20):
                client, _, start = self.router.recv_multipart()
                for seq, payload in self.buffer:
                    if seq >= int.from_bytes(start, "big"):
                        self.router.send_multipart([client, b"", b"", seq.to_bytes(8, "big"), payload])
                self.router.send_multipart([client, b"", b"", END_SEQ, b""])
            else:
                time.sleep(0.02)

    def close(self):
        self.context.destroy(linger=0)


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(kv_events, "HEARTBEAT_SECONDS", 0.1)
    monkeypatch.setattr(kv_events, "REPLAY_WAIT_SECONDS", 0.4)
    monkeypatch.setattr(kv_events, "STALE_SECONDS", 1.0)


def serve_until(publisher, condition, seconds=5):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        publisher.serve(0.1)
        if condition():
            return
    raise AssertionError("not reached")


def test_the_subscriber_fills_a_gap_by_replay_and_starts_again_with_a_restarted_engine(tmp_path, quick):
    publisher = Publisher(tmp_path)
    subscriber = KvEvents()
    try:
        publisher.publish(stored([11], PROMPT[:4]))  # before anyone subscribed: only in the buffer
        blocks = subscriber.blocks(publisher.endpoint, publisher.replay)
        serve_until(publisher, lambda: blocks.seq == 0 and subscriber.silence(blocks) == "")
        assert blocks.matched(prompt_chain(PROMPT, BLOCK)) == 1
        time.sleep(0.3)  # the SUB socket connected
        publisher.skip(stored([12], PROMPT[4:8], parent=11))  # missed live
        publisher.publish(stored([13], PROMPT[8:12], parent=12))  # its gap asks for the missed batch
        serve_until(publisher, lambda: blocks.seq == 2)
        assert blocks.matched(prompt_chain(PROMPT, BLOCK)) == 3 and blocks.gaps == 0

        # Batches the engine no longer buffers: the index starts again from what comes next, and says so a while.
        publisher.buffer.clear()
        publisher.skip(removed([11]))
        publisher.buffer.clear()
        publisher.publish(stored([31], [7, 7, 7, 7]))
        serve_until(publisher, lambda: blocks.seq == 4)
        assert blocks.gaps == 1 and blocks.matched(prompt_chain(PROMPT, BLOCK)) == 0  # nothing it cannot vouch for
        assert "could no longer replay" in subscriber.silence(blocks)

        # The engine started again: its batches are numbered from 0, its cache is empty.
        publisher.seq, publisher.buffer = 0, []
        publisher.publish(stored([41], PROMPT[:4]))
        serve_until(publisher, lambda: blocks.seq == 0 and blocks.matched(prompt_chain(PROMPT, BLOCK)) == 1)
        assert blocks.matched(prompt_chain([7, 7, 7, 7], BLOCK)) == 0
    finally:
        subscriber.stop()
        publisher.close()


def test_a_stream_that_stops_answering_is_silent_and_trusted_again_once_it_answers(tmp_path, quick):
    publisher = Publisher(tmp_path)
    subscriber = KvEvents()
    try:
        publisher.publish(stored([11, 12], PROMPT[:8]))
        blocks = subscriber.blocks(publisher.endpoint, publisher.replay)
        serve_until(publisher, lambda: subscriber.silence(blocks) == "" and blocks.seq == 0)
        publisher.answering = False  # no batch, no answer on the replay socket (a paused or dead engine)
        wait_until(lambda: subscriber.silence(blocks).startswith("silent for"), seconds=5, interval=0.1,
                   message="silent")
        publisher.answering = True
        serve_until(publisher, lambda: subscriber.silence(blocks) == "")
        assert blocks.matched(prompt_chain(PROMPT, BLOCK)) == 2  # rebuilt from what the engine still buffers
    finally:
        subscriber.stop()
        publisher.close()
