"""Calibration text for AWQ, for engine/quantize_runner.py (it runs inside the engine venv: standard library
only here; the model's tokenizer is passed in).

`builtin` is a corpus built deterministically from the docstrings of a fixed list of stdlib modules (the same text
for one Python minor version); a file is the user's own domain text. Either is split into paragraphs (blank lines),
then lines, then token windows, and paragraphs are packed greedily into chunks of fewer than max_seq_len tokens
(measured with the model's tokenizer, as AutoAWQ measures them: it silently drops longer samples)."""
import re
from pathlib import Path

# The builtin calibration corpus: prose-rich, pure-Python stdlib modules present from Python 3.9 to 3.13 that
# import without side effects. A module missing from some Python is skipped (the list is the same on one
# Python minor version, so the corpus is too).
BUILTIN_CORPUS_MODULES = sorted([
    "_pydecimal", "argparse", "calendar", "collections", "concurrent.futures", "configparser", "contextlib",
    "csv", "dataclasses", "difflib", "email.message", "enum", "fractions", "ftplib", "functools", "gettext",
    "heapq", "http.client", "http.cookiejar", "imaplib", "inspect", "ipaddress", "json", "logging", "mailbox",
    "optparse", "pathlib", "pickle", "pickletools", "platform", "poplib", "pprint", "random", "shlex", "shutil",
    "smtplib", "socket", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "tokenize", "traceback", "typing", "unittest.case", "urllib.parse", "urllib.request", "uuid", "warnings",
    "weakref", "zipfile",
])


class CalibrationError(ValueError):
    """The calibration text cannot be used; the message says why, for a user."""


def builtin_paragraphs():
    """Paragraphs of the docstrings of BUILTIN_CORPUS_MODULES: each module's docstring, then its own classes and
    functions (and the classes' own methods) in name order. The same text on every run of one Python."""
    import importlib
    import inspect

    seen = set()
    for module_name in BUILTIN_CORPUS_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        docs = [module.__doc__]
        for name, value in sorted(vars(module).items()):
            if not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            if getattr(value, "__module__", None) != module.__name__:
                continue  # imported from elsewhere: its own module lists it (or not)
            docs.append(value.__doc__)
            if inspect.isclass(value):
                for _, member in sorted(vars(value).items()):
                    if inspect.isfunction(member):
                        docs.append(member.__doc__)
        for doc in docs:
            if not isinstance(doc, str):
                continue
            for paragraph in split_paragraphs(inspect.cleandoc(doc)):
                if paragraph not in seen and len(paragraph.split()) >= 3:
                    seen.add(paragraph)
                    yield paragraph


def split_paragraphs(text):
    for paragraph in re.split(r"\n[ \t\r\f\v]*\n", text):
        paragraph = paragraph.strip()
        if paragraph:
            yield paragraph


def read_calibration_file(path):
    """The text of a user's calibration file, or bad_calibration saying what is wrong with it."""
    path = Path(path)
    if not path.exists():
        raise CalibrationError(f"the calibration file {path} does not exist")
    if not path.is_file():
        raise CalibrationError(f"the calibration file {path} is not a regular file")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CalibrationError(f"the calibration file {path} cannot be read: {error.strerror}") from None
    if not data.strip():
        raise CalibrationError(f"the calibration file {path} is empty: give it some text of the kind "
                               f"the model will see (a few thousand words)")
    nul = data.find(b"\0")
    if nul >= 0:
        raise CalibrationError(f"the calibration file {path} holds NUL bytes (the first at offset "
                               f"{nul}): it looks binary, not text; give a UTF-8 text file (plain "
                               f"text, markdown, code)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise CalibrationError(f"the calibration file {path} is not UTF-8 text (invalid byte at "
                               f"offset {error.start}); convert it to UTF-8") from None


def count_tokens(tokenizer, text):
    # As AutoAWQ measures a sample: tokenizer.encode(text.strip()), special tokens included.
    return len(tokenizer.encode(text.strip()))


def pieces_under(tokenizer, text, limit):
    """`text` as pieces of fewer than `limit` tokens each: whole if it fits, else by lines, else by token
    windows (decoded back to text and measured again). Yields (piece, tokens)."""
    text = text.strip()
    if not text:
        return
    tokens = count_tokens(tokenizer, text)
    if tokens < limit:
        yield text, tokens
        return
    lines = [line for line in text.split("\n") if line.strip()]
    if len(lines) > 1:
        for line in lines:
            yield from pieces_under(tokenizer, line, limit)
        return
    ids = tokenizer.encode(text, add_special_tokens=False)
    window = max(8, limit // 2)
    for start in range(0, len(ids), window):
        piece = tokenizer.decode(ids[start:start + window]).strip()
        if piece:
            piece_tokens = count_tokens(tokenizer, piece)
            if 0 < piece_tokens < limit:
                yield piece, piece_tokens


def make_samples(paragraphs, tokenizer, *, max_samples, max_seq_len):
    """Pack paragraphs greedily into at most `max_samples` chunks of fewer than `max_seq_len` tokens each.
    Returns (samples, total tokens)."""
    samples, counts = [], []
    current, current_tokens = [], 0

    def close():
        nonlocal current, current_tokens
        if not current:
            return
        chunk = "\n\n".join(current)
        tokens = count_tokens(tokenizer, chunk)
        if tokens < max_seq_len:
            samples.append(chunk)
            counts.append(tokens)
        else:  # joining changed the tokenization past the limit: keep the pieces apart
            for piece in current:
                if len(samples) < max_samples:
                    samples.append(piece)
                    counts.append(count_tokens(tokenizer, piece))
        current, current_tokens = [], 0

    for paragraph in paragraphs:
        for piece, tokens in pieces_under(tokenizer, paragraph, max_seq_len):
            # Two tokens of slack a join: the "\n\n" between pieces, and a merge across it.
            if current and current_tokens + tokens + 2 >= max_seq_len:
                close()
                if len(samples) >= max_samples:
                    return samples[:max_samples], sum(counts[:max_samples])
            current.append(piece)
            current_tokens += tokens + (2 if len(current) > 1 else 0)
    close()
    return samples[:max_samples], sum(counts[:max_samples])
