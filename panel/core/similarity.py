"""How much two answers say the same: word-level F1, as SQuAD scores answers. Offline, no model: the evaluation sets'
`agrees` checks and the shadow tests of a route (a candidate's answer against the one the client got) both use it."""
import re
import string
import unicodedata
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCTUATION = frozenset(string.punctuation)


def similarity(answer, reference) -> float:
    """Word-level F1 between two texts, as SQuAD scores answers: lower-cased, punctuation and the articles a/an/the
    removed, whitespace-split; F1 of the two multisets of words. 1.0 when both are empty, 0.0 when only one is.

    Punctuation is ASCII punctuation (as in SQuAD) plus any Unicode punctuation, so that "Paris。" and "Paris" agree.
    Not a string counts as "". Works offline. F1 is computed as 2 * common / (words + words), one division, so
    that a score of exactly 3/5 compares equal to a threshold of 0.6."""
    mine, theirs = _words(answer), _words(reference)
    if not mine or not theirs:
        return 1.0 if mine == theirs else 0.0
    common = sum((Counter(mine) & Counter(theirs)).values())
    return 2 * common / (len(mine) + len(theirs))


def _words(text):
    if not isinstance(text, str):
        return []
    text = "".join(char for char in text.lower() if not _is_punctuation(char))
    return _ARTICLES.sub(" ", text).split()


def _is_punctuation(char):
    return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")
