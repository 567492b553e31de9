"""Where the panel may send a request on a team's behalf: channels (save, import, Test, the gateway), benchmark
targets and webhooks.

- Loopback (and the private address of an engine host) only for the panel's own deployments' local channels
  (`loopback_ok`: their address is the worker's, not a user's choice); private, link-local (the cloud
  metadata address 169.254.169.254), shared and reserved ranges only where the operator lists them in
  TOKENWISE_OUTBOUND_ALLOW (CIDRs). Public addresses are fine.
- The panel's own origin (its port on this machine, the names in ALLOWED_HOSTS, TOKENWISE_PUBLIC_URL) is refused:
  a channel pointed there would call the gateway in a loop.
- The address checked is the address connected to: the gateway's own client (panel/gateway/http_client.py)
  checks every address it resolves and every literal one with `address_refusal`; aiohttp sessions connect through
  `PolicyConnector` (every resolved address and every literal address checked), httpx calls go to the address
  `pinned` resolved and checked (the name stays in Host and in TLS). A name that resolves to a public address when
  saved and to 127.0.0.1 later (DNS rebinding) is refused at request time; a name that does not resolve is refused
  too, never handed to httpx, which would look it up again (a rebinding name can fail once, then answer 127.0.0.1).
- An answer is read with a cap (`read_capped`): decoded a step at a time, so a small gzip answer that decodes to
  gigabytes never sits in memory.
- No outbound call follows a redirect: a 3xx is the upstream's error (a 307 to another address would carry the body
  and the credential header past every check here).
- Every request carries HOP_HEADER; the gateway refuses a request that has it, so nothing loops even through a
  name the checks did not recognise."""
import functools
import ipaddress
import socket
import zlib
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import ThreadedResolver
from django.conf import settings

HOP_HEADER = "X-Tokenwise-Hop"
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


class OutboundRefused(OSError):
    """The URL or the address it resolves to is not one the panel may call; the message says why, in words."""


@functools.lru_cache(maxsize=8)
def _networks(cidrs):
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def allowed_networks():
    return _networks(tuple(settings.OUTBOUND_ALLOW_CIDRS))


def address_refusal(address, *, loopback_ok=False):
    """Why the panel may not connect to `address` (an IP), in words; "" when it may."""
    try:
        ip = ipaddress.ip_address(str(address).split("%", 1)[0])
    except ValueError:
        return f"{address} is not an address"
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    if any(ip.version == network.version and ip in network for network in allowed_networks()):
        return ""
    if ip.is_loopback or ip.is_unspecified:
        if loopback_ok:
            return ""
        return (f"{ip} is this machine (loopback): only the panel's own deployments are called there. If an "
                "engine you run yourself listens there, the operator can allow it in TOKENWISE_OUTBOUND_ALLOW")
    if ip.is_link_local:
        return (f"{ip} is a link-local address (where cloud machines keep their metadata and credentials); the "
                "panel does not call it unless the operator lists it in TOKENWISE_OUTBOUND_ALLOW")
    if not ip.is_global or ip.is_multicast:
        if loopback_ok and ip.is_private:  # an engine host's own address (TOKENWISE_ENGINE_ADVERTISE_HOST)
            return ""
        return (f"{ip} is a private or reserved address; the panel calls one only when the operator lists its "
                "range in TOKENWISE_OUTBOUND_ALLOW")
    return ""


def panel_origins():
    """{(host, port)} of the panel itself."""
    port = settings.PANEL_PORT
    hosts = {"127.0.0.1", "localhost", "::1", "0.0.0.0", settings.PANEL_BIND}
    hosts |= {host.lstrip(".").lower() for host in settings.ALLOWED_HOSTS if host not in ("*", "testserver")}
    origins = {(host.lower(), port) for host in hosts}
    if settings.PUBLIC_URL:
        public = urlsplit(settings.PUBLIC_URL)
        if public.hostname:
            origins.add((public.hostname.lower(), public.port or (443 if public.scheme == "https" else 80)))
    return origins


def _host_port(url):
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def origin_refusal(url):
    host, port = _host_port(url)
    if (host, port) in panel_origins() or (host.startswith("127.") and ("127.0.0.1", port) in panel_origins()):
        return (f"{host}:{port} is this panel itself: a channel pointed there would call the gateway in a loop "
                "(point it at the engine or provider instead)")
    return ""


def static_refusal(url, *, loopback_ok=False):
    """The checks that need no DNS: the panel's own origin, a literal address, a loopback name."""
    try:
        host, _ = _host_port(url)
    except ValueError:
        return "the URL has a port that is not a number"
    refusal = origin_refusal(url)
    if refusal:
        return refusal
    if host in LOOPBACK_NAMES:
        return address_refusal("127.0.0.1", loopback_ok=loopback_ok).replace("127.0.0.1", host, 1)
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return ""
    return address_refusal(host, loopback_ok=loopback_ok)


def _resolve(host, port):
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(info[4][0] for info in infos))


def resolved_refusal(host, addresses, *, loopback_ok=False):
    """Why the panel may not call `host`, which resolved to `addresses`, in words ("" when it may): one address
    it may not reach is enough."""
    for address in addresses:
        refusal = address_refusal(address, loopback_ok=loopback_ok)
        if refusal:
            return f"{host} resolves to {refusal}"
    return ""


def url_refusal(url, *, loopback_ok=False):
    """Why the panel may not call `url`, in words ("" when it may): at save and import. A name is resolved and
    every address checked; a name that does not resolve is left to the Test button to explain."""
    refusal = static_refusal(url, loopback_ok=loopback_ok)
    if refusal:
        return refusal
    host, port = _host_port(url)
    return resolved_refusal(host, _resolve(host, port), loopback_ok=loopback_ok)


def pinned(url, *, loopback_ok=False):
    """(url with the host replaced by a checked address, headers, httpx extensions) for one httpx request: the
    name stays in Host and in TLS (sni_hostname), the connection goes to the address checked here. Raises
    OutboundRefused."""
    refusal = static_refusal(url, loopback_ok=loopback_ok)
    if refusal:
        raise OutboundRefused(refusal)
    parts = urlsplit(url)
    host, port = _host_port(url)
    headers = {HOP_HEADER: "1", "Accept-Encoding": "gzip, deflate"}  # what read_capped decodes
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return url, headers, {}
    except ValueError:
        pass
    addresses = _resolve(host, port)
    if not addresses:  # never left to httpx: its own lookup could answer what this one did not (DNS rebinding)
        raise OutboundRefused(f"the name {host} does not resolve (check its spelling and this machine's DNS); "
                              "nothing was sent")
    refusal = resolved_refusal(host, addresses, loopback_ok=loopback_ok)
    if refusal:
        raise OutboundRefused(refusal)
    address = addresses[0]
    netloc = (f"[{address}]" if ":" in address else address) + (f":{parts.port}" if parts.port else "")
    headers["Host"] = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), headers, {
        "sni_hostname": host}


def body_decoder(content_encoding):
    """A zlib decoder for an answer's Content-Encoding (gzip or deflate), to be fed a step at a time with a cap on
    each step's output; None for an answer sent as it is."""
    encoding = (content_encoding or "").strip().lower()
    if encoding not in ("gzip", "deflate"):
        return None
    return zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)


def read_capped(response, limit):
    """(body, cut) of an httpx response opened with `stream`: at most `limit` bytes of it, decoded (gzip and deflate
    here, a step at a time; `pinned` asks for no other encoding), and whether there was more. What is past the cap
    is neither read nor decoded."""
    decoder = body_decoder(response.headers.get("content-encoding"))
    body = bytearray()
    for chunk in response.iter_raw():
        while chunk:
            if decoder is None:
                body += chunk[:limit + 1 - len(body)]
                chunk = b""
            else:
                try:
                    body += decoder.decompress(chunk, limit + 1 - len(body))
                except zlib.error:
                    return bytes(body[:limit]), False
                chunk = decoder.unconsumed_tail
            if len(body) > limit:
                return bytes(body[:limit]), True
    return bytes(body), False


class PolicyResolver(AbstractResolver):
    """aiohttp's resolver with every address checked: the connection goes only to an address that passed."""

    def __init__(self, *, loopback_ok=False, engine_hosts=()):
        self.loopback_ok = loopback_ok
        self.engine_hosts = set(engine_hosts)  # names of the panel's own engines (a benchmark of a route)
        self.inner = ThreadedResolver()

    async def resolve(self, host, port=0, family=socket.AF_INET):
        results = await self.inner.resolve(host, port, family)
        loopback_ok = self.loopback_ok or host in self.engine_hosts
        refusals = [address_refusal(result["host"], loopback_ok=loopback_ok) for result in results]
        allowed = [result for result, refusal in zip(results, refusals) if not refusal]
        if not allowed or any(refusals):
            raise OutboundRefused(f"{host} resolves to {next(refusal for refusal in refusals if refusal)}")
        return allowed

    async def close(self):
        await self.inner.close()


class PolicyConnector(aiohttp.TCPConnector):
    """aiohttp's connector under the policy: names resolve through `PolicyResolver`, and an address written in the
    URL (which aiohttp connects to without asking any resolver) is checked the same way."""

    def __init__(self, *, loopback_ok=False, engine_hosts=(), **options):
        self.loopback_ok, self.engine_hosts = loopback_ok, set(engine_hosts)
        super().__init__(resolver=PolicyResolver(loopback_ok=loopback_ok, engine_hosts=engine_hosts), **options)

    async def _resolve_host(self, host, port, traces=None):
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return await super()._resolve_host(host, port, traces=traces)
        refusal = address_refusal(host, loopback_ok=self.loopback_ok or host in self.engine_hosts)
        if refusal:
            raise OutboundRefused(refusal)
        return await super()._resolve_host(host, port, traces=traces)
