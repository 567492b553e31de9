"""A request's prompt as the engine's token ids, for KV-event placement (gateway/kv_events.py, decision 0099): the
model's own `tokenizer.json` (the `tokenizers` package, in Rust) and its chat template rendered with Jinja2 as
transformers renders it for vLLM. Only the prompt's leading part is read (TOKENIZED_CHARS): placement needs its
shared prefix, and a prefix of the text tokenizes as the text does, but for its last few tokens (which the caller
drops by whole blocks).

The work is bounded and off the event loop, whatever the body (decision 0101): only the leading part of the messages
and of the tools is rendered (`head`: at most TOKENIZED_CHARS of each), rendering and tokenizing run in one thread
of their own (TOKENIZING), the Rust tokenizer lets go of the GIL while it works, and a request waits for its tokens
at most ENCODE_SECONDS; past that, or while QUEUED_AT_MOST prompts wait for the thread, it is placed by prefix.

A rendering that differs from the engine's (a template feature this does not pass) costs only cache hits: the
leading blocks that match still match, and a miss is placed by the route's prefix-aware rule."""
import asyncio
import json
import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from panel.gateway.kv_index import prompt_chain

log = logging.getLogger(__name__)

TOKENIZED_CHARS = 32768  # about 8,000 tokens of English: far past any system prompt and tools worth placing on
CACHED_PIECES = 4096  # the text between two special tokens (a system prompt, the tools) tokenized once, then kept
ENCODE_SECONDS = 0.25  # how long a request waits for its prompt's tokens before it is placed by prefix
QUEUED_AT_MOST = 4  # prompts waiting for the tokenizing thread; the next one is placed by prefix without waiting


class ModelTokens:
    """One model's tokenizer and chat template.

    The tokenizer splits its input at its added tokens (`<|im_start|>`…) and tokenizes each piece between them on
    its own; so does this, keeping each piece's ids: a system prompt or a tool list that many requests share is
    tokenized once per process (2 ms for 1,300 tokens here; a dict lookup after)."""

    def __init__(self, tokenizer, template, special):
        self.tokenizer, self.template, self.special = tokenizer, template, special
        added = {token.content: token_id for token_id, token in tokenizer.get_added_tokens_decoder().items()}
        self.added = added
        self.splitter = re.compile("(" + "|".join(re.escape(text) for text in sorted(added, key=len, reverse=True))
                                   + ")") if added else None
        self.pieces = {}

    def ids(self, body, api="chat"):
        """The prompt's leading token ids, or None for a request this cannot render. Milliseconds of CPU for a
        new text: called in the tokenizing thread (Tokenizing.ids), never on the event loop. A Messages request
        (`api` "messages") is rendered as the chat request it becomes for the engine."""
        if api == "messages":
            body = _messages_as_chat(body)
            if body is None:
                return None
        text = self.text(body)
        return None if text is None else self.encode(text[:TOKENIZED_CHARS])

    def encode(self, text):
        pieces = [piece for piece in self.splitter.split(text) if piece] if self.splitter else [text]
        known = {piece: self.pieces[piece] for piece in pieces if piece in self.pieces}
        new = [piece for piece in dict.fromkeys(pieces) if piece not in self.added and piece not in known]
        if new:
            # The batch call lets go of the GIL while it tokenizes; a single `encode` holds it throughout (seconds for
            # megabytes of text), and the event loop with it.
            for piece, encoding in zip(new, self.tokenizer.encode_batch_fast(new, add_special_tokens=False)):
                known[piece] = encoding.ids
                if len(self.pieces) >= CACHED_PIECES:
                    self.pieces.pop(next(iter(self.pieces)))  # the oldest first
                self.pieces[piece] = encoding.ids
        ids = []
        for piece in pieces:
            if piece in self.added:
                ids.append(self.added[piece])
            else:
                ids.extend(known[piece])
        return ids

    def text(self, body):
        """The prompt's text, rendered from the body's leading part (`head`): its first TOKENIZED_CHARS are the
        whole body's."""
        messages = body.get("messages")
        if isinstance(messages, list):
            if self.template is None:
                return None
            rendered = [_message(message) for message in head(messages)]
            if None in rendered:
                return None
            tools = body.get("tools")
            try:
                return self.template.render(messages=rendered, tools=head(tools) if tools is not None else None,
                                            add_generation_prompt=True, **self.special)
            except Exception as error:  # a template that needs what this does not pass: no placement by tokens
                log.debug("chat template not rendered (%s)", type(error).__name__)
                return None
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        return prompt[:TOKENIZED_CHARS] if isinstance(prompt, str) else None


def head(value, chars=TOKENIZED_CHARS):
    """The leading part of a JSON value, whatever its size, in work bounded by `chars`: a copy keeping strings,
    keys, items and members in their order until `chars` characters (a string cut there, what follows dropped).
    Each value counts at least one character, as in any rendering of it; so where the template renders what it is
    given in that order, the copy's rendering is the whole value's for at least `chars` characters past its start.
    Where it does not (a long field the template skips), fewer of the prompt's blocks match: only cache hits are
    lost."""
    return _head(value, [chars, -chars])


def _head(value, left):
    if isinstance(value, str):
        kept = value[:max(left[0], 0)]
        left[0] -= max(len(kept), 1)
        return kept
    left[0] -= 1
    if isinstance(value, dict):
        # Past the characters a member keeps its key with an empty value (a block keeps its "text", a tool its
        # "input_schema": the copy still reads as a request), for as many characters again at most.
        copy = {}
        for key, item in value.items():
            if left[0] <= left[1]:
                break
            left[0] -= len(key) if isinstance(key, str) else 1
            copy[key] = _head(item, left) if left[0] > 0 else _empty(item)
        return copy
    if isinstance(value, list):
        copy = []
        for item in value:
            if left[0] <= 0:
                break
            copy.append(_head(item, left))
        return copy
    return value


def _empty(value):
    return type(value)() if isinstance(value, (str, list, dict)) else value


def _messages_as_chat(body):
    """A Messages request's leading part as a chat request (gateway/translation.py; vLLM's own Messages endpoint
    turns it into the same messages), or None where it does not translate."""
    from panel.gateway.translation import messages_request_to_chat

    try:
        return messages_request_to_chat({"system": head(body.get("system")), "messages": head(body.get("messages")),
                                         "tools": head(body.get("tools")), "max_tokens": 1}, model_id="")
    except Exception as error:  # a body the gateway would refuse, or cut where it no longer reads as a request
        log.debug("a Messages request not rendered for placement (%s)", type(error).__name__)
        return None


def _message(message):
    """A message as the template reads it: its content as one string (text parts joined, as vLLM does for a
    template that takes strings)."""
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    if isinstance(content, list):
        texts = [part.get("text") for part in content if isinstance(part, dict)]
        if not all(isinstance(text, str) for text in texts):
            return None
        content = "\n".join(texts)
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        return None
    return {**message, "content": content}


def load(path):
    """The model's ModelTokens from its folder, or None where it has no tokenizer.json."""
    from tokenizers import Tokenizer  # the Rust tokenizer: loaded only where a route places by KV events

    folder = Path(path)
    if not (folder / "tokenizer.json").is_file():
        return None
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = {}
    if (folder / "tokenizer_config.json").is_file():
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    source = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        source = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if isinstance(source, list):  # named templates: the default one
        source = next((item.get("template") for item in source if item.get("name") == "default"), None)
    template = None
    if isinstance(source, str):
        template = _environment().from_string(source)
    special = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
    return ModelTokens(tokenizer, template, special)


def _token_text(value):
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _environment():
    """Jinja2 as transformers sets it up for chat templates: its `tojson` (no HTML escaping, keys in their order),
    `raise_exception`, `strftime_now` and loop controls."""
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message):
    raise ValueError(message)


class Tokenizers:
    """Each model's ModelTokens, loaded off the request path (a loader thread): `get` answers None until then."""

    def __init__(self):
        self._models = {}
        self._lock = threading.Lock()

    def get(self, path):
        model = self._models.get(path)
        if model is not None or not path:
            return model or None
        with self._lock:
            if path in self._models:
                return self._models[path] or None
            self._models[path] = False  # loading
        threading.Thread(target=self._load, args=(path,), name="tokenizer-load", daemon=True).start()
        return None

    def _load(self, path):
        try:
            self._models[path] = load(path) or False
        except Exception:
            log.warning("tokenizer of %s not loaded", path, exc_info=True)
        if not self._models[path]:
            log.info("no tokenizer for %s: its requests are placed without KV events", path)


class Tokenizing:
    """The one thread where prompts are rendered and tokenized. A request waits for its tokens at most
    ENCODE_SECONDS; while QUEUED_AT_MOST prompts are queued or being tokenized the next is not queued. A request
    that stops waiting (past the deadline, or its client left) takes its prompt out of the queue if the thread has
    not started it."""

    def __init__(self):
        self._executor = None
        self._lock = threading.Lock()
        self.queued = 0

    async def ids(self, model, body, api="chat"):
        """(the prompt's leading token ids or None, "" or why there are none)"""
        return await self._run(model.ids, body, api)

    async def chains(self, model, body, api="chat", sizes=()):
        """({block size: the chain keys of the prompt's whole blocks} or None, "" or why there are none): the
        chain keys too are made in the thread (BLAKE2b over every block: most of the rest of the work)."""
        return await self._run(_chains, model, body, api, tuple(sizes))

    async def _run(self, function, *args):
        with self._lock:
            if self.queued >= QUEUED_AT_MOST:
                return None, f"{self.queued} prompts are waiting for the gateway's tokenizer"
            self.queued += 1
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
        work = self._executor.submit(function, *args)
        work.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(work), ENCODE_SECONDS), ""
        except TimeoutError:
            return None, f"its prompt was not tokenized within {ENCODE_SECONDS * 1000:.0f} ms"
        except Exception:
            log.warning("a prompt not tokenized", exc_info=True)
            return None, "its prompt could not be tokenized"

    def _done(self, _work):
        with self._lock:
            self.queued -= 1


def _chains(model, body, api, sizes):
    tokens = model.ids(body, api)
    return None if tokens is None else {size: prompt_chain(tokens, size) for size in sizes}


TOKENIZERS = Tokenizers()
TOKENIZING = Tokenizing()
