"""vLLM pools: a channel for engines the panel did not start (an llm-d gateway, a production-stack router, a KServe
service, a plain vLLM). The gateway calls its base URL like a remote channel's; the scraper reads its engines'
/metrics (its scrape URLs, with its bearer token) like a deployment's (dashboards/scraper.py), so the dashboards and
the ledger count them; its GPUs × the price of one GPU-hour is its GPU-time cost (the Cost tab, evaluation runs and
the autopilot); its batch slots let the spill rule estimate its wait.

Here: the checks on a pool's fields at save, its token kept encrypted (core/crypto.py, as a stored channel key), and
what the scraper sends."""
import re
from decimal import Decimal, InvalidOperation
from urllib.parse import urlsplit, urlunsplit

from panel.channels.models import ChannelKind, CredentialError
from panel.core import crypto, outbound
from panel.env import EnvError

MAX_SCRAPE_URLS = 16
MAX_GPUS = 100_000
MAX_BATCH_SLOTS = 1_000_000
MAX_GPU_HOUR_PRICE = Decimal(999_999)
TOKEN_CHARS_RE = re.compile(r"^[\x21-\x7e]{1,500}$")
POOL_ONLY = ("scrape_urls", "gpu_count", "price_per_gpu_hour", "batch_slots")


def scrape_url_errors(text):
    """(cleaned text, errors) for a pool's scrape URLs, one a line: each an http(s) URL the outbound policy lets the
    panel call, without credentials, a query's secrets or a fragment."""
    urls = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not urls:
        return "", ["Enter the /metrics URL of each engine of the pool (or of its router), one a line, for example "
                    "http://10.0.0.5:8000/metrics."]
    if len(urls) > MAX_SCRAPE_URLS:
        return text, [f"A pool has at most {MAX_SCRAPE_URLS} scrape URLs; this has {len(urls)}."]
    errors, cleaned = [], []
    for url in urls:
        problem = _url_problem(url)
        if problem:
            errors.append(f"{url[:120]}: {problem}")
            continue
        parts = urlsplit(url)
        cleaned.append(urlunsplit((parts.scheme, parts.netloc, parts.path or "/metrics", parts.query, "")))
    if not errors and len(set(cleaned)) != len(cleaned):
        errors.append("A scrape URL appears twice: its engine would be counted twice.")
    return "\n".join(cleaned), errors


def _url_problem(url):
    if len(url) > 300:
        return "longer than 300 characters."
    if re.search(r"[\s\x00-\x1f\x7f]", url):
        return "contains spaces or control characters."
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "a scrape URL starts with http:// or https://."
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return "its port is not a number from 1 to 65535."
    if not host or port == 0:
        return "it has no host name." if not host else "its port is not a number from 1 to 65535."
    if parts.username or parts.password:
        return "put the token in the scrape token field, not in the URL (a URL ends up in logs)."
    if parts.fragment:
        return "a scrape URL has no #fragment."
    refusal = outbound.url_refusal(url)
    return f"the panel does not call this address: {refusal}." if refusal else ""


def token_errors(token):
    stripped = token.strip()
    if stripped.lower().startswith("bearer"):
        return ["Enter the token without \"Bearer\": the scraper adds \"Bearer \" itself."]
    if not TOKEN_CHARS_RE.match(stripped):
        return ["A token is 1-500 plain ASCII characters without spaces or line breaks: copy it again."]
    return []


def pool_check(channel, *, scrape_token=""):
    """({field: [errors]}, [warnings]) for a pool's own fields; cleans scrape_urls in place. Another kind of channel
    has none of them: they are cleared (pool_fields_clear) when it is saved."""
    errors, warnings = {}, []
    if channel.kind != ChannelKind.POOL:
        return errors, warnings
    cleaned, url_errors = scrape_url_errors(channel.scrape_urls)
    if url_errors:
        errors["scrape_urls"] = url_errors
    else:
        channel.scrape_urls = cleaned
    if scrape_token:
        if token_errors(scrape_token):
            errors["scrape_token"] = token_errors(scrape_token)
    gpus = channel.gpu_count
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= MAX_GPUS:
        errors["gpu_count"] = [f"Enter the number of GPUs the pool's engines run on, from 0 to {MAX_GPUS:,}."]
    price = channel.price_per_gpu_hour
    if price is not None and not isinstance(price, Decimal):  # a service caller's "1.75" or 2
        try:
            price = channel.price_per_gpu_hour = Decimal(str(price))
        except InvalidOperation:
            price = Decimal("NaN")
    if price is not None and (not price.is_finite()
                              or not 0 <= price <= MAX_GPU_HOUR_PRICE):
        errors["price_per_gpu_hour"] = [f"Enter the price of one GPU-hour, from 0 to {MAX_GPU_HOUR_PRICE:,}."]
    elif price is not None and not gpus and "gpu_count" not in errors:
        errors["gpu_count"] = ["A price per GPU-hour needs the number of GPUs it is paid for."]
    elif price is None:
        warnings.append("No price per GPU-hour: the pool's GPU time costs nothing on the Cost tab and in evaluation "
                        "runs until one is set.")
    slots = channel.batch_slots
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int)
                              or not 1 <= slots <= MAX_BATCH_SLOTS):
        errors["batch_slots"] = [f"Enter the requests the pool runs at once (the sum of its engines' "
                                 f"--max-num-seqs), from 1 to {MAX_BATCH_SLOTS:,}, or leave it empty."]
    if channel.deployment_id:
        errors["deployment"] = ["A vLLM pool runs engines the panel did not start: it has no deployment."]
    return errors, warnings


def pool_token_store(channel, scrape_token, *, before_urls):
    """Encrypt a typed token onto the channel; keep the stored one when none is typed, unless the scrape URLs now
    reach another server (a stored token never follows them there without someone typing it). Returns the errors."""
    if channel.kind != ChannelKind.POOL:
        pool_fields_clear(channel)
        return {}
    if scrape_token:
        token = scrape_token.strip()
        try:
            channel.scrape_token_ciphertext = crypto.encrypt(token)
        except EnvError as error:
            return {"scrape_token": [f"The token cannot be stored: {error}"]}
        channel.scrape_token_last4 = token[-4:]
        return {}
    if channel.scrape_token_ciphertext and not _origins(channel.scrape_urls) <= _origins(before_urls):
        return {"scrape_token": ["A scrape URL now points at another server: enter the token again (a stored token "
                                 "is never sent to a new server without someone typing it)."]}
    return {}


def pool_fields_clear(channel):
    channel.scrape_urls, channel.scrape_token_ciphertext, channel.scrape_token_last4 = "", "", ""
    channel.gpu_count, channel.price_per_gpu_hour, channel.batch_slots = 0, None, None


def _origins(text):
    found = set()
    for line in (text or "").splitlines():
        try:
            parts = urlsplit(line.strip())
            found.add((parts.scheme.lower(), (parts.hostname or "").lower(), parts.port))
        except ValueError:
            continue
    return found


def scrape_headers(channel):
    """The scraper's headers for a pool's URLs: its token as a bearer, decrypted here (CredentialError in words)."""
    if not channel.scrape_token_ciphertext:
        return {}
    try:
        return {"Authorization": f"Bearer {crypto.decrypt(channel.scrape_token_ciphertext)}"}
    except EnvError as error:
        raise CredentialError(str(error)) from None


def pool_facts(channel):
    """What the gateway's Target carries of a pool's engines (channels/routing.py): their words, the requests they
    run at once (for the spill rule, gateway/spill.py) and their GPU price per hour (what the panel's own requests,
    Compare and evaluation runs, say of their cost)."""
    return {"engine_words": f"the vLLM pool {channel.name}", "batch_slots": channel.batch_slots,
            "gpu_hourly": channel.gpu_hourly_price()}
