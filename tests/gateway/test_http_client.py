"""The gateway's own HTTP/1.1 client (panel/gateway/http_client.py) against a server that writes exactly the bytes
each test gives it: framing, kept connections, deadlines, the outbound policy and broken answers."""
import asyncio
import concurrent.futures
import gzip
import socket

import pytest

from panel.core import outbound
from panel.gateway import http_client

OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


def run(scenario):
    """`scenario(server)` in an event loop of its own (whatever this thread runs), with a server on loopback."""
    async def main():
        server = Server()
        await server.start()
        try:
            return await scenario(server)
        finally:
            await http_client.close_kept()
            await server.stop()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result(timeout=30)


class Server:
    """Answers each request with the next item of `answers`: bytes, or a list of bytes and pauses (seconds), then
    closes the connection when the item says `close`."""

    def __init__(self):
        self.answers, self.connections, self.requests = [], 0, []
        self.closed_by_client = 0  # connections the client closed between requests

    async def start(self):
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/chat/completions"

    async def stop(self):
        self.server.close()

    async def serve(self, reader, writer):
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0)
                for part in answer if isinstance(answer, list) else [answer]:
                    if part == "close":
                        writer.close()
                        return
                    if isinstance(part, (int, float)):
                        await asyncio.sleep(part)
                    else:
                        writer.write(part)
                        await writer.drain()
        except asyncio.IncompleteReadError as error:
            self.closed_by_client += not error.partial
            writer.close()
        except ConnectionError:
            writer.close()


async def post(server, **options):
    options.setdefault("loopback_ok", True)
    return await http_client.post(server.url, b'{"model": "m"}', {"content-type": "application/json"}, **options)


def sized(body):
    return OK_HEAD + b"content-length: %d\r\n\r\n" % len(body) + body


def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_a_connection_is_kept_and_reused_after_a_whole_response():
    async def scenario(server):
        server.answers = [sized(b"one"), sized(b"two")]
        bodies = []
        for _ in range(2):
            response = await post(server)
            bodies.append((response.status, response.headers["content-type"], await response.read()))
            response.release()
        return bodies, server.connections, server.requests

    bodies, connections, requests = run(scenario)
    assert bodies == [(200, "text/event-stream", b"one"), (200, "text/event-stream", b"two")]
    assert connections == 1
    assert requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"content-length: 14\r\n" in requests[0] and requests[0].endswith(b'\r\n\r\n{"model": "m"}')


def test_a_chunked_stream_arrives_as_it_is_written():
    async def scenario(server):
        server.answers = [[OK_HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n"), 0.3,
                           chunk(b"data: 2\n\n") + b"0\r\n\r\n"]]
        response = await post(server)
        loop = asyncio.get_running_loop()
        began = loop.time()
        first = await response.content.readany()
        first_at = loop.time() - began
        rest = await response.read()
        return first, first_at, rest, response.content.at_eof()

    first, first_at, rest, at_eof = run(scenario)
    assert first == b"data: 1\n\n" and first_at < 0.25  # not held until the whole body is in
    assert rest == b"data: 2\n\n" and at_eof


def test_a_kept_connection_the_server_closed_while_idle_is_replaced():
    async def scenario(server):
        server.answers = [[sized(b"one"), "close"], sized(b"two")]
        first = await post(server)
        await first.read()
        first.release()  # kept, though the server is closing it
        second = await post(server)
        return await second.read(), server.connections

    body, connections = run(scenario)
    assert body == b"two" and connections == 2


def test_a_kept_connection_closed_as_the_request_left_is_resent_once_and_one_closed_later_is_not():
    """A close that crosses the request (the server's idle timer) costs a resend on a new connection; a server that
    held the request longer may have worked on it, and a second copy could be charged twice: that is an error."""
    async def scenario(server):
        server.answers = [sized(b"one"), "close", sized(b"two"), sized(b"three"), [0.5, "close"]]
        bodies = []
        for _ in range(2):
            response = await post(server)
            bodies.append(await response.read())
            response.release()
        resent = (server.connections, len(server.requests))
        third = await post(server)
        bodies.append(await third.read())
        third.release()
        try:
            await post(server)
        except http_client.Disconnected as error:
            failed = (error.received, str(error))
        return bodies, resent, failed, server.connections, len(server.requests)

    bodies, resent, failed, connections, requests = run(scenario)
    assert bodies == [b"one", b"two", b"three"] and resent == (2, 3)
    assert failed == (False, "the upstream closed the connection")
    assert (connections, requests) == (2, 5)  # held 0.5 s, then closed: not sent again


def test_a_stream_cut_before_its_length_is_an_error_and_the_connection_is_not_kept():
    async def scenario(server):
        server.answers = [[OK_HEAD + b"content-length: 100\r\n\r\nshort", "close"], sized(b"next")]
        response = await post(server)
        with pytest.raises(http_client.Disconnected, match="closed the connection"):
            await response.read()
        response.release()
        again = await post(server)
        return await again.read(), server.connections

    body, connections = run(scenario)
    assert body == b"next" and connections == 2


def test_a_body_without_length_runs_to_the_close():
    async def scenario(server):
        server.answers = [[OK_HEAD + b"\r\nall of it", "close"]]
        response = await post(server)
        return await response.read(), response.complete

    assert run(scenario) == (b"all of it", True)


def test_the_total_deadline_ends_a_slow_body():
    async def scenario(server):
        server.answers = [[OK_HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n"), 5]]
        response = await post(server, total=0.5)
        assert await response.content.readany() == b"data: 1\n\n"
        with pytest.raises(TimeoutError):
            await response.content.readany()
        return True

    assert run(scenario)


def test_a_caller_that_stops_waiting_closes_the_connection():
    async def scenario(server):
        server.answers = [[5, sized(b"late")], sized(b"fresh")]
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await post(server)
        response = await post(server)
        return await response.read(), server.connections

    assert run(scenario) == (b"fresh", 2)  # the late answer never lands on the next request


def test_a_gzip_body_is_decoded():
    async def scenario(server):
        packed = gzip.compress(b'{"ok": true}')
        server.answers = [OK_HEAD + b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(packed) + packed]
        response = await post(server)
        return await response.read()

    assert run(scenario) == b'{"ok": true}'


def test_an_answer_that_is_not_http_is_an_error():
    async def scenario(server):
        server.answers = [b"SSH-2.0-OpenSSH_9.6\r\n\r\n"]
        with pytest.raises(http_client.Disconnected, match="not HTTP"):
            await post(server)
        return True

    assert run(scenario)


def test_nothing_is_sent_with_a_line_break_in_a_header():
    async def scenario(server):
        with pytest.raises(ValueError, match="line break"):
            await http_client.post(server.url, b"{}", {"authorization": "Bearer k\r\nx-evil: 1"}, loopback_ok=True)
        return server.connections

    assert run(scenario) == 0


def test_the_outbound_policy_is_applied_to_the_address_connected_to(settings):
    settings.OUTBOUND_ALLOW_CIDRS = []

    async def scenario(server):
        server.answers = [sized(b"ok")]
        with pytest.raises(outbound.OutboundRefused, match="loopback"):
            await post(server, loopback_ok=False)  # an address written in the URL
        by_name = server.url.replace("127.0.0.1", "localhost")
        with pytest.raises(outbound.OutboundRefused, match="localhost resolves to .*loopback"):
            await http_client.post(by_name, b"{}", {}, loopback_ok=False)  # a name, checked where it resolves
        with pytest.raises(http_client.DNSError):
            await http_client.post("http://no-such-host.invalid/v1", b"{}", {})
        response = await post(server)  # the panel's own engines may be reached
        return server.connections, await response.read()

    assert run(scenario) == (1, b"ok")


def test_a_connection_that_is_refused_is_a_transport_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def scenario(server):
        with pytest.raises(ConnectionRefusedError):
            await http_client.post(f"http://127.0.0.1:{port}/v1", b"{}", {}, loopback_ok=True, connect_timeout=5)
        return True

    assert run(scenario)


def self_signed(directory):
    """A certificate for localhost and 127.0.0.1, signed by itself: (certificate path, key path)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                              x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_checks_the_certificate_against_the_name_in_the_url(tmp_path, monkeypatch):
    import ssl

    cert_path, key_path = self_signed(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert_path, key_path)

    async def scenario(server):
        server.answers = [sized(b"over tls")]
        tls_server = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=served)
        url = f"https://localhost:{tls_server.sockets[0].getsockname()[1]}/v1/chat/completions"
        try:
            with pytest.raises(ssl.SSLCertVerificationError):  # not trusted by the system's CA store
                await http_client.post(url, b"{}", {}, loopback_ok=True)
            trusting = ssl.create_default_context(cafile=str(cert_path))
            monkeypatch.setattr(http_client, "_tls", trusting)
            response = await http_client.post(url, b"{}", {}, loopback_ok=True)
            return response.status, await response.read()
        finally:
            tls_server.close()

    assert run(scenario) == (200, b"over tls")


def test_an_attempt_that_cannot_be_sent_says_why_and_is_not_retried(settings):
    from panel.channels.routing import Target
    from panel.gateway import upstream

    settings.OUTBOUND_ALLOW_CIDRS = []

    def target(api_key, loopback_ok):
        return Target(id=1, name="c", base_url="http://127.0.0.1:9/v1", model_id="m", api_key=api_key,
                      credential_error="", timeout=5, max_retries=0, backoff=0, channel=None, loopback_ok=loopback_ok)

    async def attempt(server, api_key, loopback_ok):
        try:
            await upstream.send_request(target(api_key, loopback_ok), "/chat/completions", {"model": "m"},
                                        upstream.Limits(first_byte=5, total=10))
        except upstream.UpstreamError as error:
            return error.kind, error.retryable, str(error)

    refused = run(lambda server: attempt(server, "k", False))
    assert refused[:2] == ("refused", False) and "loopback" in refused[2]
    broken_key = run(lambda server: attempt(server, "k\r\nx-injected: 1", True))
    assert broken_key[:2] == ("misconfigured", False) and "line break" in broken_key[2]


def test_a_kept_connection_idle_past_the_bound_is_closed(monkeypatch):
    monkeypatch.setattr(http_client, "KEEP_IDLE_SECONDS", 0.3)

    async def scenario(server):
        server.answers = [sized(b"one")]
        response = await post(server)
        await response.read()
        response.release()  # kept
        await asyncio.sleep(0.8)
        return server.closed_by_client, dict(http_client._idle.get(asyncio.get_running_loop(), {}))

    closed, kept = run(scenario)
    assert closed == 1 and not any(kept.values())


def test_a_kept_connection_is_closed_before_the_servers_own_keep_alive_timeout():
    async def scenario(server):
        server.answers = [OK_HEAD + b"keep-alive: timeout=2, max=100\r\ncontent-length: 3\r\n\r\none"]
        response = await post(server)
        await response.read()
        response.release()
        await asyncio.sleep(1.3)  # the server would close at 2 s: the client closes first, a second before it
        return server.closed_by_client

    assert run(scenario) == 1
    assert http_client.kept_idle_limit({"keep-alive": "timeout=5"}) == 4
    assert http_client.kept_idle_limit({}) == http_client.KEEP_IDLE_SECONDS


def test_at_most_a_few_connections_are_kept_per_origin(monkeypatch):
    monkeypatch.setattr(http_client, "KEEP_PER_ORIGIN", 3, raising=False)

    async def scenario(server):
        server.answers = [sized(b"x") for _ in range(8)]
        responses = await asyncio.gather(*(post(server) for _ in range(8)))  # a burst: eight connections
        for response in responses:
            await response.read()
            response.release()
        await asyncio.sleep(0.2)
        kept = http_client._idle[asyncio.get_running_loop()]
        return server.connections, server.closed_by_client, sum(len(connections) for connections in kept.values())

    connections, closed, kept = run(scenario)
    assert (connections, kept, closed) == (8, 3, 5)
