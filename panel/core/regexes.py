"""Regular expressions a team writes (evaluation checks, JSON Schema patterns, the redaction of traffic samples): which
are safe to run. Python's re has no timeout, so a pattern is capped in length and refused when it nests repetition or
repeats a group of alternatives (see _repetition_risk); pattern_problems() says what is wrong in words for the team.
Pure Python."""
import re

MAX_PATTERN_CHARS = 500
REGEX_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL}

# Problems of a regular expression; {name} is "the pattern" for a regex check, "the schema's pattern /…/" in a schema.
NESTED_REPETITION = "{name} nests repetition (like (a+)+), which can take forever on some answers: flatten it"
REPEATED_ALTERNATIVES = ("{name} repeats a group of alternatives (like (a|aa)+), which can take forever on some "
                         "answers: flatten it")
VERBOSE_PATTERN = "{name} turns on verbose mode ((?x)), which checks do not support"

_OPEN_QUANTIFIER = re.compile(r"\{\d*,\d*\}")  # {n,} {n,m} {,m}: {n} alone repeats a fixed number of times
_INLINE_FLAGS = re.compile(r"\(\?([aiLmsux]*)(?:-[imsx]*)?[:)]")


def pattern_problems(pattern, flags=0, name="the pattern"):
    """What is wrong with a regular expression for a check: too long, does not compile, verbose mode (which would
    hide repetition from _repetition_risk), or repetition that can backtrack for ever."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return [f"{name} is too long: {len(pattern):,} characters, at most {MAX_PATTERN_CHARS:,}"]
    try:
        compiled = re.compile(pattern, flags)
    except re.error as error:
        return [f"{name} is not a valid regular expression: {error}"]
    except (OverflowError, RecursionError):
        return [f"{name} is not a valid regular expression: it is too large or nested too deeply"]
    risk = _repetition_risk(pattern)
    if compiled.flags & re.VERBOSE or risk == "verbose":
        return [VERBOSE_PATTERN.format(name=name)]
    if risk == "nested":
        return [NESTED_REPETITION.format(name=name)]
    if risk == "alternatives":
        return [REPEATED_ALTERNATIVES.format(name=name)]
    return []


def _repetition_risk(pattern):
    """None, or why the pattern may backtrack catastrophically: "nested", "alternatives" or "verbose".

    The rule, deliberately simple and conservative: a group (any parenthesis) that contains a repetition (`*`, `+`,
    `{n,}`, `{n,m}`, at any depth) or an alternation (`|`) and is itself followed by a repetition is refused. So
    `(a+)+`, `(\\w*)*`, `((ab)+)+` and `(a|aa){2,}` are refused; `\\d{4}-\\d{2}`, `(ab)+`, `(a+)?` and `(ab){3}` are
    fine. It refuses some safe patterns, such as `[a-z]+(\\.[a-z]+)*` and `(cat|dog)+`: a team can write those
    differently. Escapes, character classes and (?#comments) are skipped; verbose mode is reported since spaces
    between a group and its repetition would hide it. The pattern is assumed to compile."""
    stack = []  # per open group: [contains a repetition, contains an alternation]
    index, end = 0, len(pattern)
    while index < end:
        char = pattern[index]
        if char == "\\":
            index += 2
        elif char == "[":
            index = _end_of_class(pattern, index)
        elif pattern.startswith("(?#", index):
            close = pattern.find(")", index)
            index = end if close < 0 else close + 1
        elif char == "(":
            flags = _INLINE_FLAGS.match(pattern, index)
            if flags and "x" in flags.group(1):
                return "verbose"
            stack.append([False, False])
            index += 1
        elif char == ")" and stack:
            repeated, alternatives = stack.pop()
            followed = _repetition_at(pattern, index + 1)
            if followed and repeated:
                return "nested"
            if followed and alternatives:
                return "alternatives"
            if stack:
                stack[-1][0] = stack[-1][0] or repeated or followed
                stack[-1][1] = stack[-1][1] or alternatives
            index += 1
        else:
            if stack and _repetition_at(pattern, index):
                stack[-1][0] = True
            if stack and char == "|":
                stack[-1][1] = True
            index += 1
    return None


def _repetition_at(pattern, index):
    """Whether an open-ended or ranged repetition (`*`, `+`, `{n,}`, `{n,m}`) starts at `index`."""
    return index < len(pattern) and (pattern[index] in "*+" or bool(_OPEN_QUANTIFIER.match(pattern, index)))


def _end_of_class(pattern, index):
    """The index just after the character class opening at `index` (a `]` first in the class is a literal)."""
    index += 1
    if pattern.startswith("^", index):
        index += 1
    if pattern.startswith("]", index):
        index += 1
    while index < len(pattern):
        if pattern[index] == "\\":
            index += 2
        elif pattern[index] == "]":
            return index + 1
        else:
            index += 1
    return index


def regex_flags(letters):
    """The re flags of a regex check's "flags" letters (each one of REGEX_FLAGS)."""
    value = 0
    for letter in letters:
        value |= REGEX_FLAGS[letter]
    return value
