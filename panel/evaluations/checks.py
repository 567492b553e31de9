"""The checks of an evaluation set: what a machine can verify on a model's answer without a person.

An evaluation case is chat messages plus a few checks. A team uploads the checks as JSON objects (one JSONL line per
case), each with a "type" naming its kind:

    {"type": "json"}                                                     the answer is JSON
    {"type": "json_schema", "schema": {...}}                             the answer is JSON that matches the schema
    {"type": "regex", "pattern": "\\d{4}", "flags": "i"}                  a regular expression finds something in it
    {"type": "contains", "text": "Paris", "case_sensitive": false}       it contains a text
    {"type": "exact", "text": "42", "case_sensitive": true}              it is exactly a text
    {"type": "agrees", "channel": "name", "min_similarity": 0.6}         it says about what another channel says
    {"type": "agrees", "answer": "...", "min_similarity": 0.6}           ... or what a recorded answer says (a sample
                                                                         of real traffic: the answer the client got)
    {"type": "judge", "channel": "name", "criteria": "..."}              another model judges it against criteria

check_problems() says what is wrong with an uploaded check (in words for the team that wrote it), run_check() runs a
valid one on an answer, describe() says what a check verifies, for a page. Pure Python: no database, no network (the
"agrees" and "judge" kinds get the other channel's answer or a judge callable from the caller).

A check reads at most MAX_ANSWER_CHARS of an answer, so that a runaway answer cannot make a check slow. Regular
expressions (of regex checks and of "pattern" keywords in schemas) are run by RE2, without backtracking, and capped
in length (panel/core/regexes.py); their validation, and the JSON Schema's, is in patterns.py."""
import json
import math
import re
from dataclasses import dataclass

import referencing.exceptions
from jsonschema.exceptions import best_match

from panel.core.similarity import similarity
from panel.evaluations.patterns import (  # noqa: F401  (the constants are re-exported for the checks' callers)
    MAX_PATTERN_CHARS,
    MAX_SCHEMA_CHARS,
    REGEX_FLAGS,
    VERBOSE_PATTERN,
    PatternError,
    cut,
    kind_of_value,
    pattern_problems,
    regex_search,
    schema_problems,
    schema_validator,
    show,
)

KINDS = ("json", "json_schema", "regex", "contains", "exact", "agrees", "judge")
MAX_CHECKS_PER_CASE = 10
MAX_ANSWER_CHARS = 20_000  # a check reads at most this much of an answer (longer answers are cut before checking)
MAX_TEXT_CHARS = 2_000  # "text" of contains/exact, "criteria" of judge
MAX_CHANNEL_CHARS = 100
DEFAULT_MIN_SIMILARITY = 0.6

# The fields each kind takes besides "type" (required or optional); problems are reported in this order.
FIELDS = {
    "json": (),
    "json_schema": ("schema",),
    "regex": ("pattern", "flags"),
    "contains": ("text", "case_sensitive"),
    "exact": ("text", "case_sensitive"),
    "agrees": ("channel", "answer", "min_similarity"),
    "judge": ("channel", "criteria"),
}

CUT_NOTE = f" (only the first {MAX_ANSWER_CHARS:,} characters of the answer were checked)"

_CODE_FENCE = re.compile(r"\A```(?:json)?[ \t]*\r?\n(?P<body>.*?)\r?\n?```\Z", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one answer: whether it passed, and why in a short sentence for the page."""

    passed: bool
    words: str


# ---------------------------------------------------------------------------------------------------------------------
# Validation of a check as uploaded
# ---------------------------------------------------------------------------------------------------------------------

def check_problems(spec) -> list[str]:
    """What is wrong with one check as uploaded (a dict); [] when it is fine.

    Each problem is a short sentence that names the field, for the team that wrote the check. Fields of other kinds
    are problems too (a typo such as "case_sensitve" would otherwise be ignored silently)."""
    if not isinstance(spec, dict):
        return ['a check is an object such as {"type": "json"}']
    kind = spec.get("type")
    if "type" not in spec:
        return [f'a check needs a "type": one of {_known_kinds()}']
    if not isinstance(kind, str) or kind not in KINDS:
        return [f'"type" {show(kind)} is not a kind of check: use one of {_known_kinds()}']
    problems = _unknown_field_problems(spec, kind)
    problems += _FIELD_CHECKERS[kind](spec, kind)
    return problems


def _known_kinds():
    return ", ".join(KINDS)


def _unknown_field_problems(spec, kind):
    """One problem naming every field the kind does not take."""
    unknown = [str(key) for key in spec if key != "type" and key not in FIELDS[kind]]
    if not unknown:
        return []
    names = ", ".join(f'"{name}"' for name in unknown)
    plural = "s" if len(unknown) > 1 else ""
    takes = _and_list([f'"{name}"' for name in FIELDS[kind]]) or 'only "type"'
    return [f'unknown field{plural} {names} for {_a_kind(kind)} check (it takes {takes})']


def _json_problems(spec, kind):
    return []


def _json_schema_problems(spec, kind):
    if "schema" not in spec:
        return [f'{_a_kind(kind)} check needs "schema" (the JSON Schema the answer must match)']
    return schema_problems(spec["schema"])


def _regex_problems(spec, kind):
    problems = []
    flags = spec.get("flags", "")
    if not isinstance(flags, str):
        problems.append(f'"flags" must be a string of the letters i, m and s, not {kind_of_value(flags)}')
        flags = ""
    elif set(flags) - set(REGEX_FLAGS):
        others = "".join(sorted(set(flags) - set(REGEX_FLAGS)))
        problems.append(f'"flags" may only contain the letters i, m and s (not "{others}")')
        flags = ""
    if "pattern" not in spec:
        problems.append(f'{_a_kind(kind)} check needs "pattern" (the regular expression to look for)')
    elif not isinstance(spec["pattern"], str):
        problems.append(f'"pattern" must be a string, not {kind_of_value(spec["pattern"])}')
    elif not spec["pattern"]:
        problems.append('"pattern" is empty')
    else:
        problems += pattern_problems(spec["pattern"], flags)
    return problems


def _contains_problems(spec, kind):
    return (_text_problems(spec, "text", f'{_a_kind(kind)} check needs "text" (the text the answer must contain)')
            + _bool_problems(spec, "case_sensitive"))


def _exact_problems(spec, kind):
    return (_text_problems(spec, "text", f'{_a_kind(kind)} check needs "text" (the answer it must equal)')
            + _bool_problems(spec, "case_sensitive"))


def _agrees_problems(spec, kind):
    if "channel" in spec and "answer" in spec:
        problems = [f'{_a_kind(kind)} check takes "channel" or "answer" (the reference), not both']
    elif "answer" in spec:
        problems = _text_problems(spec, "answer", "", limit=MAX_ANSWER_CHARS)
    else:
        problems = _channel_problems(spec, f'{_a_kind(kind)} check needs "channel" (the channel whose answer is the '
                                           f'reference) or "answer" (a recorded answer)')
    if "min_similarity" in spec:
        value = spec["min_similarity"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f'"min_similarity" must be a number, not {kind_of_value(value)}')
        elif not 0 < value <= 1:  # NaN fails this too
            problems.append(f'"min_similarity" must be more than 0 and at most 1, not {value}')
    return problems


def _judge_problems(spec, kind):
    return (_channel_problems(spec, f'{_a_kind(kind)} check needs "channel" (the channel that judges the answer)')
            + _text_problems(spec, "criteria", f'{_a_kind(kind)} check needs "criteria" (what the judge should '
                                               f'look for in the answer)'))


_FIELD_CHECKERS = {
    "json": _json_problems,
    "json_schema": _json_schema_problems,
    "regex": _regex_problems,
    "contains": _contains_problems,
    "exact": _exact_problems,
    "agrees": _agrees_problems,
    "judge": _judge_problems,
}


def _text_problems(spec, field, missing, limit=MAX_TEXT_CHARS):
    """A required, non-blank string of at most `limit` characters. Blank counts as empty: "exact" strips both sides,
    and a text of only spaces is never what a team means."""
    if field not in spec:
        return [missing]
    value = spec[field]
    if not isinstance(value, str):
        return [f'"{field}" must be a string, not {kind_of_value(value)}']
    if not value.strip():
        return [f'"{field}" is empty']
    if len(value) > limit:
        return [f'"{field}" is too long: {len(value):,} characters, at most {limit:,}']
    return []


def _channel_problems(spec, missing):
    return _text_problems(spec, "channel", missing, limit=MAX_CHANNEL_CHARS)


def _bool_problems(spec, field):
    if field in spec and not isinstance(spec[field], bool):
        return [f'"{field}" must be true or false, not {kind_of_value(spec[field])}']
    return []



# ---------------------------------------------------------------------------------------------------------------------
# Running a check
# ---------------------------------------------------------------------------------------------------------------------

def run_check(spec, answer, *, reference=None, judge=None) -> CheckResult:
    """Run one valid check (check_problems(spec) == []) on `answer`, the model's text.

    An answer of None or not a string counts as "" (the model gave no text). Only the first MAX_ANSWER_CHARS of the
    answer are checked; when a check fails on a cut answer the words say so.

    `reference`: the reference channel's answer, for "agrees"; None (or not a string) and the check cannot run: it
    fails, saying the reference answer is missing. `judge`: a callable judge(criteria, answer) -> (passed, words)
    for "judge"; None and the check fails, saying no judge channel was asked. Errors of the judge callable (a
    channel that cannot be reached) are the caller's to handle: they are not a verdict on the answer."""
    text, cut = _answer_text(answer)
    result = _RUNNERS[spec["type"]](spec, text, reference=reference, judge=judge)
    if cut and not result.passed:
        return CheckResult(False, result.words + CUT_NOTE)
    return result


def _answer_text(answer):
    """The part of the answer a check reads, and whether it was cut."""
    if not isinstance(answer, str):
        return "", False
    return answer[:MAX_ANSWER_CHARS], len(answer) > MAX_ANSWER_CHARS


def _run_json(spec, text, **_):
    data, error = _parse_json_answer(text)
    if error:
        return CheckResult(False, f"not JSON: {error}")
    return CheckResult(True, "valid JSON")


def _run_json_schema(spec, text, **_):
    data, error = _parse_json_answer(text)
    if error:
        return CheckResult(False, f"not JSON: {error}")
    validator = schema_validator(spec["schema"])
    try:
        failure = best_match(validator.iter_errors(data))
    except RecursionError:
        return CheckResult(False, "the answer is nested too deeply to check against the schema")
    except referencing.exceptions.Unresolvable as error:
        return CheckResult(False, f"the schema refers to a part of itself that does not exist: {cut(str(error), 120)}")
    if failure is None:
        return CheckResult(True, "matches the JSON schema")
    return CheckResult(False, f"at {failure.json_path}: {cut(failure.message, 200)}")


def _run_regex(spec, text, **_):
    flags = spec.get("flags", "")
    shown = f"/{cut(spec['pattern'], 80)}/{flags}"
    try:
        found = regex_search(spec["pattern"], text, flags)
    except PatternError as error:  # saved before RE2 refused it
        return CheckResult(False, f"the pattern cannot be run: {error}")
    if found:
        return CheckResult(True, f"matched {shown}")
    return CheckResult(False, f"no match for {shown}")


def _run_contains(spec, text, **_):
    wanted = spec["text"]
    if spec.get("case_sensitive", False):
        found = wanted in text
    else:
        found = wanted.casefold() in text.casefold()
    return CheckResult(found, f"contains {_quote(wanted)}" if found else f"does not contain {_quote(wanted)}")


def _run_exact(spec, text, **_):
    wanted, given = spec["text"].strip(), text.strip()
    if spec.get("case_sensitive", True):
        same = wanted == given
    else:
        same = wanted.casefold() == given.casefold()
    if same:
        return CheckResult(True, f"is exactly {_quote(wanted)}")
    return CheckResult(False, f"is {_quote(given)}, not exactly {_quote(wanted)}")


def _run_agrees(spec, text, *, reference, **_):
    if "answer" in spec:
        reference = spec["answer"]
    channel = spec.get("channel")
    if not isinstance(reference, str):
        return CheckResult(False, f"the reference answer is missing (channel {channel} gave none to compare with)")
    needed = spec.get("min_similarity", DEFAULT_MIN_SIMILARITY)
    score = similarity(text, reference[:MAX_ANSWER_CHARS])
    passed = score >= needed
    score_words, needed_words = _scores_in_words(score, needed)
    if passed:
        return CheckResult(True, f"agrees {score_words} with the reference (needs {needed_words})")
    return CheckResult(False, f"agrees only {score_words} with the reference (needs {needed_words})")


def _scores_in_words(score, needed):
    """Both numbers with the same decimals (2, or 4 for a threshold such as 0.655); the score is rounded down, so a
    failing score never reads as high as the threshold."""
    decimals = 2 if round(needed, 2) == needed else 4
    scale = 10 ** decimals
    shown = math.floor(score * scale + 1e-9) / scale
    return f"{shown:.{decimals}f}", f"{needed:.{decimals}f}"


def _run_judge(spec, text, *, judge, **_):
    if judge is None:
        return CheckResult(False, f"no judge channel was asked (this check needs channel {spec['channel']})")
    passed, words = judge(spec["criteria"], text)
    passed = bool(passed)
    words = " ".join(str(words or "").split())
    if not words:
        words = "the judge approved the answer" if passed else "the judge did not approve the answer"
    return CheckResult(passed, cut(words, 300))


_RUNNERS = {
    "json": _run_json,
    "json_schema": _run_json_schema,
    "regex": _run_regex,
    "contains": _run_contains,
    "exact": _run_exact,
    "agrees": _run_agrees,
    "judge": _run_judge,
}


def _parse_json_answer(text):
    """(data, None) when the answer is JSON, else (None, why not in words).

    Surrounding whitespace is ignored, and so is a single markdown code fence around the whole answer (```json on
    its own line ... ``` or ``` ... ```): models often wrap JSON that way even when asked not to. NaN and Infinity
    are refused (Python accepts them, JSON does not)."""
    body = text.strip()
    fenced = _CODE_FENCE.match(body)
    if fenced and "```" not in fenced.group("body"):
        body = fenced.group("body").strip()
    if not body:
        return None, "the answer is empty"
    try:
        return json.loads(body, parse_constant=_refuse_constant), None
    except json.JSONDecodeError as error:
        return None, f"{error.msg} at line {error.lineno} column {error.colno}"
    except ValueError as error:  # _refuse_constant, or an integer with too many digits
        return None, cut(str(error), 200)
    except RecursionError:
        return None, "nested too deeply"


def _refuse_constant(name):
    raise ValueError(f"{name} is not allowed in JSON")


# ---------------------------------------------------------------------------------------------------------------------
# Similarity
# ---------------------------------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------------------------------
# Words
# ---------------------------------------------------------------------------------------------------------------------

def describe(spec) -> str:
    """The check in words for a page, e.g. 'valid JSON', 'matches the JSON schema (3 properties)', 'matches /…/i',
    'contains "Paris"', 'is exactly "42"', 'agrees with channel taotoken (word F1 ≥ 0.6)', 'judged by channel
    gpt-judge: <criteria, cut to 80 characters>'. Long texts are cut to 80 characters. A check that is not valid
    gets 'a check that is not valid' rather than an error, so a page can always show something."""
    if not isinstance(spec, dict) or spec.get("type") not in KINDS or not isinstance(spec.get("type"), str):
        return "a check that is not valid"
    try:
        return _DESCRIBERS[spec["type"]](spec)
    except (KeyError, TypeError, AttributeError, ValueError):
        return "a check that is not valid"


def _describe_json(spec):
    return "valid JSON"


def _describe_json_schema(spec):
    properties = spec["schema"].get("properties")
    if isinstance(properties, dict) and properties:
        count = len(properties)
        return f"matches the JSON schema ({count} propert{'y' if count == 1 else 'ies'})"
    return "matches the JSON schema"


def _describe_regex(spec):
    return f"matches /{cut(spec['pattern'], 80)}/{spec.get('flags', '')}"


def _describe_contains(spec):
    sensitive = " (case-sensitive)" if spec.get("case_sensitive", False) else ""
    return f"contains {_quote(spec['text'], 80)}{sensitive}"


def _describe_exact(spec):
    ignoring = "" if spec.get("case_sensitive", True) else " (ignoring case)"
    return f"is exactly {_quote(spec['text'].strip(), 80)}{ignoring}"


def _describe_agrees(spec):
    needed = spec.get("min_similarity", DEFAULT_MIN_SIMILARITY)
    if "answer" in spec:
        return f"agrees with the recorded answer {_quote(spec['answer'])} (word F1 ≥ {needed:g})"
    return f"agrees with channel {spec['channel']} (word F1 ≥ {needed:g})"


def _describe_judge(spec):
    return f"judged by channel {spec['channel']}: {cut(' '.join(spec['criteria'].split()), 80)}"


_DESCRIBERS = {
    "json": _describe_json,
    "json_schema": _describe_json_schema,
    "regex": _describe_regex,
    "contains": _describe_contains,
    "exact": _describe_exact,
    "agrees": _describe_agrees,
    "judge": _describe_judge,
}



def _quote(text, limit=60):
    """A text in double quotes for words, on one line and cut."""
    return f'"{cut(" ".join(text.split()), limit)}"'



def _a_kind(kind):
    """'a "regex"', 'an "exact"': a kind named in a sentence."""
    return f'{"an" if kind[0] in "aeiou" else "a"} "{kind}"'


def _and_list(items):
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
