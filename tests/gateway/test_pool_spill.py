"""Spill to the cloud on overload, for a vLLM pool (engines the panel did not start): a route whose first channel is
a pool with one batch slot, busy with a request, sends the next one to its cloud channel first when the expected wait
(the requests beyond its slots × its measured time per request) passes the route's spill wait; the row says
`spilled` and the trail the wait it avoided; a pool without batch slots is passed by."""
import threading

from panel.channels.models import Channel, ChannelKind, Route
from panel.channels.routing import target_for
from tests.support.gateway import CHAT, fallback, gateway, post, primary, records, setup  # noqa: F401 (fixtures)
from tests.support.waiting import wait_until

STREAM = dict(CHAT, stream=True)


def pool_first(setup, *, batch_slots):
    """The route's first channel becomes a vLLM pool (the `primary` fake, one batch slot); the route spills past
    300 ms."""
    Channel.objects.filter(pk=setup["local"].pk).update(kind=ChannelKind.POOL, batch_slots=batch_slots,
                                                        scrape_urls="http://127.0.0.1:9/metrics")
    Route.objects.filter(pk=setup["route"].pk).update(spill_wait_ms=300)


def trail(row):
    return [(step["channel"], step["outcome"]) for step in row.attempt_trail]


def test_a_busy_pool_spills_the_next_request_to_the_cloud_and_a_free_one_keeps_it(gateway, setup, primary, fallback):
    pool_first(setup, batch_slots=1)
    assert target_for(Channel.objects.get(pk=setup["local"].pk)).batch_slots == 1
    primary.chunk_delay = 0.05  # 20 chunks: an answer takes about a second
    first = post(gateway, setup["raw"], STREAM)  # alone: no wait, and its time per request is measured
    assert first.status_code == 200, first.text
    busy = threading.Thread(target=post, args=(gateway, setup["raw"], STREAM))
    busy.start()
    wait_until(lambda: len(primary.requests) == 2, seconds=10, interval=0.02, message="the pool busy")
    spilled = post(gateway, setup["raw"], STREAM)  # its slot is taken: a second's wait, past 300 ms
    busy.join(timeout=30)
    assert spilled.status_code == 200, spilled.text
    rows = records(3)
    row = next(row for row in rows if row.channel_id == setup["cloud"].pk)
    assert row.spilled is True and trail(row) == [("local", "spilled"), ("cloud", "ok")]
    assert len(primary.requests) == 2 and len(fallback.requests) == 1  # the pool never saw the spilled one
    again = post(gateway, setup["raw"], STREAM)  # the slot is free again: it stays on the pool
    assert again.status_code == 200
    last = records(4)[-1]
    assert last.channel_id == setup["local"].pk and not last.spilled and trail(last) == [("local", "ok")]


def test_a_pool_without_batch_slots_never_spills(gateway, setup, primary, fallback):
    pool_first(setup, batch_slots=None)
    primary.chunk_delay = 0.05
    assert post(gateway, setup["raw"], STREAM).status_code == 200
    busy = threading.Thread(target=post, args=(gateway, setup["raw"], STREAM))
    busy.start()
    wait_until(lambda: len(primary.requests) == 2, seconds=10, interval=0.02, message="the pool busy")
    response = post(gateway, setup["raw"], STREAM)
    busy.join(timeout=30)
    assert response.status_code == 200
    assert [row.spilled for row in records(3)] == [None, None, None] and not fallback.requests
