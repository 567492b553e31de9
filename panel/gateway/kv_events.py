"""The replicas' KV-cache events, for a route that balances by them (`kv_events`, decision 0099): one subscriber
thread per web process, with a ZMQ SUB socket on each replica's event stream and a DEALER on its replay socket,
keeps each replica's ReplicaBlocks (gateway/kv_index.py). A replica is first heard from when a request needs it.

vLLM sends no heartbeat and numbers its batches (0, 1, 2 … from each start). Every HEARTBEAT_SECONDS the thread asks
each replay socket for the batches after the last one it applied: the engine answers with those it missed (none,
usually) and an end marker, which proves the stream alive while nothing is cached. A replica not heard from for
STALE_SECONDS is "silent" (its index is rebuilt from a replay from 0 once it answers again: it may have started
again, empty), and so is one whose index was just cleared after a gap the engine no longer buffers: a request on
its route is then placed by the prefix-aware rule, and its trail says why. A batch numbered below the last one
means the engine started again: the index is rebuilt the same way."""
import logging
import threading
import time

import zmq

from panel.gateway.kv_index import BatchDecoder, ReplicaBlocks

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0
STALE_SECONDS = 10.0  # no batch and no answer from the replay socket this long: the replica's index is not trusted
REPLAY_WAIT_SECONDS = 2.0  # a replay request unanswered this long is sent again
FORGET_SECONDS = 600.0  # a replica no request asked about this long is unsubscribed
END_SEQ = (-1).to_bytes(8, "big", signed=True)
POLL_MS = 100


def _seq(frame):
    return int.from_bytes(frame, "big")


class Stream:
    """One replica's subscription, owned by the subscriber thread (but `blocks` and `used_at`)."""

    def __init__(self, endpoint, replay):
        self.endpoint, self.replay = endpoint, replay
        self.blocks = ReplicaBlocks()
        self.used_at = time.monotonic()
        self.sub = self.dealer = None
        self.asked_at = None  # when the replay request in flight was sent (None: none in flight)
        self.asked_from = 0  # ... and the first batch it asked for
        self.pending = []  # live batches that arrived while a replay was in flight: (seq, payload)
        self.first_replayed = None  # the first batch the replay in flight answered with
        self.doubt = False  # silent past STALE_SECONDS: the index is rebuilt at its next answer


class KvEvents:
    def __init__(self):
        self.streams = {}  # endpoint -> Stream
        self._lock = threading.Lock()
        self._thread = None
        self._stopping = threading.Event()
        self._decoder = BatchDecoder()

    def stop(self):
        """End the subscriber thread (a process ending needs nothing: the thread is a daemon)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def blocks(self, endpoint, replay):
        """The replica's ReplicaBlocks (subscribing on first use: empty and silent until its first answer)."""
        stream = self.streams.get(endpoint)
        if stream is None:
            with self._lock:
                stream = self.streams.get(endpoint)
                if stream is None:
                    stream = self.streams[endpoint] = Stream(endpoint, replay)
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
                    self._thread.start()
        stream.used_at = time.monotonic()
        return stream.blocks

    def silence(self, blocks, now=None):
        """Why a replica's index is not to be trusted now, in words, or "" when it is."""
        now = time.monotonic() if now is None else now
        if blocks.heard_at is None:
            return "not heard from yet"
        if now - blocks.heard_at > STALE_SECONDS:
            return f"silent for {now - blocks.heard_at:.0f} s"
        if blocks.lost and now - blocks.lost_at < STALE_SECONDS:
            return blocks.lost
        return ""

    # The subscriber thread.

    def _run(self):
        context = zmq.Context()
        poller = zmq.Poller()
        beat_at = 0.0
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                with self._lock:
                    streams = list(self.streams.values())
                for stream in streams:
                    if now - stream.used_at > FORGET_SECONDS:
                        self._close(poller, stream)
                        with self._lock:
                            self.streams.pop(stream.endpoint, None)
                    elif stream.sub is None:
                        self._open(context, poller, stream)
                if now - beat_at >= HEARTBEAT_SECONDS:
                    beat_at = now
                    for stream in streams:
                        if stream.dealer is not None:
                            self._heartbeat(context, poller, stream, now)
                for socket, _ in poller.poll(POLL_MS):
                    stream = next((item for item in streams if socket in (item.sub, item.dealer)), None)
                    if stream is not None:
                        self._drain(socket, stream)
        except Exception:  # never seen; a request then finds every replica silent and places by prefix
            log.exception("KV events subscriber stopped")
        finally:
            context.destroy(linger=0)

    def _open(self, context, poller, stream):
        stream.sub = context.socket(zmq.SUB)
        stream.sub.setsockopt(zmq.SUBSCRIBE, b"")
        stream.sub.connect(stream.endpoint)
        poller.register(stream.sub, zmq.POLLIN)
        self._new_dealer(context, poller, stream)
        self._ask(stream, 0)  # what the engine still buffers: its cache from before this process subscribed

    def _new_dealer(self, context, poller, stream):
        stream.dealer = context.socket(zmq.DEALER)
        stream.dealer.connect(stream.replay)
        poller.register(stream.dealer, zmq.POLLIN)

    def _close(self, poller, stream):
        for socket in (stream.sub, stream.dealer):
            if socket is not None:
                poller.unregister(socket)
                socket.close(linger=0)
        stream.sub = stream.dealer = None

    def _ask(self, stream, start):
        stream.asked_at, stream.asked_from, stream.first_replayed = time.monotonic(), start, None
        stream.dealer.send_multipart([b"", start.to_bytes(8, "big")], flags=zmq.NOBLOCK)

    def _heartbeat(self, context, poller, stream, now):
        if stream.asked_at is not None and now - stream.asked_at < REPLAY_WAIT_SECONDS:
            return
        heard = stream.blocks.heard_at
        if heard is None or now - heard > STALE_SECONDS:
            stream.doubt = True  # gone, or starting again with an empty cache: rebuild once it answers
        try:  # the same socket: a slow answer still counts, and ZMQ reconnects to an engine started again
            self._ask(stream, stream.blocks.seq + 1 if stream.asked_at is None else stream.asked_from)
        except zmq.Again:
            stream.asked_at = now

    def _resync(self, stream):
        """Forget the index and rebuild it from everything the engine still buffers."""
        stream.blocks.clear()
        stream.blocks.seq = -1
        stream.pending = []
        try:
            self._ask(stream, 0)
        except zmq.Again:
            stream.asked_at = time.monotonic()

    def _drain(self, socket, stream):
        while True:
            try:
                frames = socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            if socket is stream.sub:
                if len(frames) == 3:
                    self._live(stream, _seq(frames[1]), frames[2])
            elif len(frames) == 4:  # replay: b"", topic, seq, payload; the end: b"", b"", END_SEQ, b""
                if frames[2] == END_SEQ:
                    self._replayed(stream)
                else:
                    self._replay(stream, _seq(frames[2]), frames[3])

    def _live(self, stream, seq, payload):
        blocks = stream.blocks
        blocks.heard_at = time.monotonic()
        if stream.asked_at is not None:
            stream.pending.append((seq, payload))
        elif seq == blocks.seq + 1:
            self._apply(blocks, seq, payload)
        elif seq <= blocks.seq:  # numbered from 0 again: the engine started again, with an empty cache
            self._resync(stream)
            stream.pending.append((seq, payload))
        else:  # batches missed: ask for them, hold this one meanwhile
            stream.pending.append((seq, payload))
            try:
                self._ask(stream, blocks.seq + 1)
            except zmq.Again:
                pass

    def _replay(self, stream, seq, payload):
        blocks = stream.blocks
        if stream.first_replayed is None:
            stream.first_replayed = seq
            if blocks.seq >= 0 and seq > blocks.seq + 1:  # the engine no longer buffers what was missed
                self._lost(blocks)
        if seq > blocks.seq:
            self._apply(blocks, seq, payload)

    def _replayed(self, stream):
        blocks = stream.blocks
        blocks.heard_at = time.monotonic()
        stream.asked_at = None
        if stream.doubt:  # silent a while: whatever it held may be gone; rebuild from what it buffers
            stream.doubt = False
            self._resync(stream)
            return
        pending, stream.pending = sorted(stream.pending, key=lambda item: item[0]), []
        if pending and pending[0][0] < stream.asked_from:  # numbered below what was asked: the engine started again
            self._resync(stream)
            stream.pending = pending
            return
        for seq, payload in pending:
            if seq <= blocks.seq:
                continue  # the replay had it
            if blocks.seq >= 0 and seq > blocks.seq + 1:  # a hole the replay did not fill
                self._lost(blocks)
            self._apply(blocks, seq, payload)

    def _lost(self, blocks):
        blocks.clear()
        blocks.lost, blocks.lost_at = "a gap in its events that the engine could no longer replay", time.monotonic()
        blocks.gaps += 1

    def _apply(self, blocks, seq, payload):
        try:
            blocks.apply(self._decoder.decode(payload))
        except Exception as error:  # a batch this cannot read: the index may now miss blocks, never invent them
            log.debug("KV event batch not read (%s)", type(error).__name__)
        blocks.seq = seq


KV_EVENTS = KvEvents()
