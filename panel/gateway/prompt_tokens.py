"""A request's prompt as the engine's token ids, for KV-event placement (gateway/kv_events.py, decision 0099): the
model's own `tokenizer.json` (the `tokenizers` package, in Rust) and its chat template rendered with Jinja2 as
transformers renders it for vLLM. Only the prompt's leading part is read (TOKENIZED_CHARS): placement needs its
shared prefix, and a prefix of the text tokenizes as the text does, but for its last few tokens (which the caller
drops by whole blocks).

A rendering that differs from the engine's (a template feature this does not pass) costs only cache hits: the
leading blocks that match still match, and a miss is placed by the route's prefix-aware rule."""
import json
import logging
import re
import threading
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment

log = logging.getLogger(__name__)

TOKENIZED_CHARS = 32768  # about 8,000 tokens of English: far past any system prompt and tools worth placing on
CACHED_PIECES = 4096  # the text between two special tokens (a system prompt, the tools) tokenized once, then kept


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

    def ids(self, body):
        """The prompt's leading token ids, or None for a request this cannot render."""
        text = self.text(body)
        return None if text is None else self.encode(text[:TOKENIZED_CHARS])

    def encode(self, text):
        if self.splitter is None:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        ids = []
        for piece in self.splitter.split(text):
            if not piece:
                continue
            known = self.added.get(piece)
            if known is not None:
                ids.append(known)
                continue
            cached = self.pieces.get(piece)
            if cached is None:
                cached = self.tokenizer.encode(piece, add_special_tokens=False).ids
                if len(self.pieces) >= CACHED_PIECES:
                    self.pieces.pop(next(iter(self.pieces)))  # the oldest first
                self.pieces[piece] = cached
            ids.extend(cached)
        return ids

    def text(self, body):
        messages = body.get("messages")
        if isinstance(messages, list):
            if self.template is None:
                return None
            rendered = [_message(message) for message in messages]
            if None in rendered:
                return None
            try:
                return self.template.render(messages=rendered, tools=body.get("tools"), add_generation_prompt=True,
                                            **self.special)
            except Exception as error:  # a template that needs what this does not pass: no placement by tokens
                log.debug("chat template not rendered (%s)", type(error).__name__)
                return None
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        return prompt if isinstance(prompt, str) else None


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
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise
        template = environment.from_string(source)
    special = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
    return ModelTokens(tokenizer, template, special)


def _token_text(value):
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


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


TOKENIZERS = Tokenizers()
