"""Regular expressions a team writes (evaluation checks, JSON Schema patterns, the redaction of traffic samples, a
quantization's `re:` keep patterns): every one is compiled and run here, by RE2 (the `google-re2` binding), an engine
without backtracking. Its time grows with the text's length whatever the pattern, so no pattern can freeze a shared
process the way `\\w*\\w*\\w*…#` froze Python's re (docs/decisions/0081-user-patterns-without-backtracking.md).

What RE2 cannot run (a backreference such as \\1, a lookahead or lookbehind, an atomic group, verbose mode) is refused
when the pattern is saved, in words that say so: pattern_problems(). Patterns are capped in length. RE2's \\w, \\d,
\\s and \\b are ASCII; \\p{L} matches a letter of any language. Pure Python besides the binding."""
import functools
import re

import re2

MAX_PATTERN_CHARS = 500
# The flag letters of a regex check, each turned on inline ((?i), (?m), (?s)).
REGEX_FLAGS = {"i": "ignore case", "m": "^ and $ match at each line", "s": ". matches a newline too"}

# Problems of a regular expression; {name} is "the pattern" for a regex check, "the schema's pattern /…/" in a schema.
WITHOUT_BACKTRACKING = "patterns here run without backtracking, so that no text can make them slow"
BACKREFERENCE = "{name} refers back to a group (like \\1 or (?P=name)), which " + WITHOUT_BACKTRACKING + \
    ": match the text again instead"
LOOKAROUND = "{name} looks ahead or behind (like (?=…), (?!…), (?<=…) or (?<!…)), which " + WITHOUT_BACKTRACKING + \
    ": match the surrounding text instead"
POSSESSIVE = "{name} uses an atomic group or a possessive repetition (like (?>…) or a++), which is not needed here: " \
    + WITHOUT_BACKTRACKING + "; write the plain group or repetition"
VERBOSE_PATTERN = "{name} turns on verbose mode ((?x)), which patterns here do not support"
END_OF_TEXT = "{name} uses \\Z, which patterns here do not support: write \\z for the end of the text"
NOT_VALID = "{name} is not a valid regular expression: {reason}"

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is answered in words, not logged by RE2 on stderr
_OPTIONS.max_mem = 4 << 20  # per pattern: a larger one is refused ("pattern too large"); its DFA cache stays small

# RE2's error about what it cannot run -> the problem in words (its other errors are shown as they are). Only RE2's
# own message is matched here, never a team's text.
_REFUSALS = (
    (re.compile(r"invalid escape sequence: \\[1-9]|invalid perl operator: \(\?P$"), BACKREFERENCE),
    (re.compile(r"invalid perl operator: \(\?<?[=!]"), LOOKAROUND),
    (re.compile(r"invalid perl operator: \(\?>|bad repetition operator: [*+?]\+"), POSSESSIVE),
    (re.compile(r"invalid perl operator: \(\?[a-z-]*x"), VERBOSE_PATTERN),
    (re.compile(r"invalid escape sequence: \\Z"), END_OF_TEXT),
)


class PatternError(ValueError):
    """A pattern that cannot be run; the message says why, in words for the team."""


def pattern_problems(pattern, flags="", name="the pattern"):
    """What is wrong with a team's regular expression: too long, does not compile, or uses what RE2 cannot run
    (each said in words); [] when it is fine. `flags`: letters of REGEX_FLAGS."""
    try:
        user_regex(pattern, flags, name=name)
    except PatternError as error:
        return [str(error)]
    return []


def user_regex(pattern, flags="", *, name="the pattern"):
    """The compiled RE2 regular expression of a team's `pattern` (cached), or PatternError in words."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"{name} is too long: {len(pattern):,} characters, at most {MAX_PATTERN_CHARS:,}")
    compiled, problem = _compiled(pattern, flags)
    if problem:
        raise PatternError(problem.format(name=name))
    return compiled


@functools.lru_cache(maxsize=512)
def _compiled(pattern, flags):
    """(compiled, None) or (None, the problem with {name} left to fill)."""
    try:
        return re2.compile(f"(?{flags}){pattern}" if flags else pattern, _OPTIONS), None
    except re2.error as error:
        reason = error.args[0].decode("utf-8", "replace") if error.args and isinstance(error.args[0], bytes) \
            else str(error)
    except UnicodeEncodeError:
        reason = "it contains a character that is not valid text"
    for refusal, problem in _REFUSALS:
        if refusal.match(reason):
            return None, problem
    return None, NOT_VALID.replace("{reason}", reason.replace("{", "{{").replace("}", "}}"))


def regex_search(pattern, text, flags=""):
    """Whether a team's `pattern` finds something in `text` (PatternError when the pattern cannot be run)."""
    return user_regex(pattern, flags).search(_valid_text(text)) is not None


def regex_redact(pattern, text, replacement):
    """(`text` with every match of a team's `pattern` replaced by the literal `replacement`, how many were)."""
    return user_regex(pattern).subn(replacement.replace("\\", "\\\\"), _valid_text(text))


def _valid_text(text):
    """RE2 reads UTF-8: a lone surrogate (JSON's "\\ud800" decodes to one) would stop it, so it becomes U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text

