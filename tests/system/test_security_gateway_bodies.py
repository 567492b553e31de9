"""Attack tests for what an upstream may send the gateway: a small gzip answer that decodes to hundreds of MB, and a
stream event that never ends. The gateway reads neither whole: the attempt fails as upstream_too_large (the next
channel answers, or the client gets a clean error), and the gateway process' peak memory hardly moves. And one from
the other side: a client that stops reading is dropped, and its upstream call ends."""
import asyncio
import concurrent.futures
import gzip
import json
import socket
import time

import pytest

from panel.channels.models import Route
from panel.gateway import http_client
from tests.support.gateway import CHAT, fallback, gateway, gateway_for, post, primary, records, setup, stream_events  # noqa: F401
from tests.support.waiting import wait_until

BOMB = 200 * 1024 * 1024  # decoded; about 200 KB on the wire
GROWTH_MB = 40  # the most the gateway's peak memory may grow while it meets one
GATEWAY_PER_TEST = True  # each test measures a gateway process of its own, its peak untouched by another test's


def peak_mb(server):
    """The gateway process' peak resident memory so far (VmHWM), in MB."""
    with open(f"/proc/{server.process.pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def warmed(gateway, setup):
    """The peak after one ordinary request (the code paths loaded), before the attack."""
    assert post(gateway, setup["raw"], CHAT).status_code == 200
    records(1)
    return peak_mb(gateway)


@pytest.fixture
def alone(setup):
    Route.objects.filter(pk=setup["route"].pk).update(fallback_on_error=False)
    return setup


def test_a_gzip_bomb_answer_is_refused_without_being_decoded_whole(gateway, alone, primary, fallback):
    before = warmed(gateway, alone)
    primary.behave("gzip_bomb", times=1, size=BOMB, sse=False)
    response = post(gateway, alone["raw"], CHAT)
    assert peak_mb(gateway) - before < GROWTH_MB, (before, peak_mb(gateway))
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "upstream_too_large"
    assert "larger than" in response.json()["error"]["message"]
    row = records(2)[-1]
    assert (row.outcome, row.error_kind) == ("error", "upstream_too_large")
    assert [step["outcome"] for step in row.attempt_trail] == ["upstream_too_large"]  # not asked again


def test_a_gzip_bomb_stream_falls_back_to_the_next_channel(gateway, setup, primary, fallback):
    before = warmed(gateway, setup)
    primary.behave("gzip_bomb", times=1, size=BOMB)
    response = post(gateway, setup["raw"], dict(CHAT, stream=True))
    assert response.status_code == 200, response.text
    assert stream_events(response)[-1] == "[DONE]"
    assert peak_mb(gateway) - before < GROWTH_MB, (before, peak_mb(gateway))
    row = records(2)[-1]
    assert (row.outcome, row.channel, row.fell_back) == ("ok", setup["cloud"], True)
    assert [step["outcome"] for step in row.attempt_trail] == ["upstream_too_large", "ok"]


def test_an_error_answer_that_decodes_to_hundreds_of_mb_is_not_read_whole(gateway, setup, primary, fallback):
    before = warmed(gateway, setup)
    primary.behave("gzip_bomb", times=1, size=BOMB, sse=False, status=500)
    response = post(gateway, setup["raw"], CHAT)
    assert peak_mb(gateway) - before < GROWTH_MB, (before, peak_mb(gateway))
    assert response.status_code == 200, response.text  # from the fallback
    row = records(2)[-1]
    assert [step["outcome"] for step in row.attempt_trail] == ["upstream_too_large", "ok"]


def test_a_stream_event_that_never_ends_is_cut_at_the_cap(gateway, setup, primary, fallback):
    before = warmed(gateway, setup)
    primary.behave("endless_event", times=1, after=1, size=64 * 1024 * 1024)
    response = post(gateway, setup["raw"], dict(CHAT, stream=True))
    assert response.status_code == 200  # the first event had reached the client: the stream ends in an error event
    events = stream_events(response)
    assert events[-1]["error"]["code"] == "upstream_too_large", events[-1]
    assert peak_mb(gateway) - before < GROWTH_MB, (before, peak_mb(gateway))
    row = records(2)[-1]
    assert (row.outcome, row.error_kind, row.channel) == ("error", "upstream_too_large", setup["local"])


def test_the_http_client_decodes_a_step_at_a_time_and_stops_at_the_limit():
    body = gzip.compress(b"a" * (32 * 1024 * 1024), 9)

    async def scenario():
        async def serve(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x"
        try:
            response = await http_client.post(url, b"{}", {}, loopback_ok=True, connect_timeout=5, total=10)
            sizes = [len(await response.readany()) for _ in range(4)]
            with pytest.raises(http_client.BodyTooLarge):
                await response.read(1024 * 1024)
            return sizes
        finally:
            await http_client.close_kept()
            server.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        sizes = pool.submit(asyncio.run, scenario()).result(timeout=30)
    assert all(0 < size <= http_client.INFLATE_STEP for size in sizes), sizes



@pytest.fixture
def gateway_quick_to_drop(transactional_db, request):
    yield from gateway_for(request, TOKENWISE_GATEWAY_CLIENT_WRITE_SECONDS="1")


def test_a_client_that_stops_reading_is_dropped_and_its_upstream_call_ends(gateway_quick_to_drop, setup, primary,
                                                                          fallback):
    """A client that asks for a long stream and then reads nothing, without closing: once a write to it has waited
    TOKENWISE_GATEWAY_CLIENT_WRITE_SECONDS, the gateway drops its connection and ends the upstream call, rather than
    hold both for as long as the client likes."""
    gateway = gateway_quick_to_drop
    primary.chunks = 60_000  # about 9 MB of events, past every socket buffer on the way
    body = json.dumps(dict(CHAT, stream=True, max_tokens=60_000)).encode()
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", int(gateway.url.rsplit(":", 1)[1])))
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
                       b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s"
                       % (setup["raw"].encode(), len(body), body))
        began = time.monotonic()
        client.settimeout(20)
        assert client.recv(64).startswith(b"HTTP/1.1 200")  # the stream began; then nothing more is read
        [row] = records(1)
        assert (row.outcome, row.error_kind, row.status_code) == ("client_closed", "client_stalled", 499)
        assert time.monotonic() - began < 15  # the gateway's write deadline, not the test's, ended it
        wait_until(lambda: primary.open_connections == 0, seconds=10, message="the upstream call ended")
        received = bytearray()  # what the sockets still held, then the connection's end: no end of the stream
        while data := client.recv(1 << 20):
            received += data
        assert b"[DONE]" not in received and not received.endswith(b"0\r\n\r\n")
