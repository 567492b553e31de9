"""What a team's pattern or JSON Schema may be: the checks of regular expressions (of regex checks and of "pattern"
keywords in schemas) and of the JSON Schemas of json_schema checks, before they are stored.

Python's re has no timeout, so a regular expression is capped in length and refused when it nests repetition or
repeats a group of alternatives (see _repetition_risk). A schema is capped in size, must name a JSON Schema version
jsonschema knows, may refer only to parts of itself, and its regular expressions follow the same rules.
pattern_problems() and schema_problems() say what is wrong in words for the team; regex_flags() turns the flag
letters of a regex check into re flags. Pure Python: no database, no network."""
import json
import re

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema import validators

MAX_PATTERN_CHARS = 500
MAX_SCHEMA_CHARS = 20_000  # the schema as compact JSON
REGEX_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL}

# Problems of a regular expression; {name} is "the pattern" for a regex check, "the schema's pattern /…/" in a schema.
NESTED_REPETITION = "{name} nests repetition (like (a+)+), which can take forever on some answers: flatten it"
REPEATED_ALTERNATIVES = ("{name} repeats a group of alternatives (like (a|aa)+), which can take forever on some "
                         "answers: flatten it")
VERBOSE_PATTERN = "{name} turns on verbose mode ((?x)), which checks do not support"

_OPEN_QUANTIFIER = re.compile(r"\{\d*,\d*\}")  # {n,} {n,m} {,m}: {n} alone repeats a fixed number of times
_INLINE_FLAGS = re.compile(r"\(\?([aiLmsux]*)(?:-[imsx]*)?[:)]")


def schema_problems(schema):
    """What is wrong with a JSON Schema for a json_schema check; [] when it is fine.

    Besides being a valid schema, it must be small (MAX_SCHEMA_CHARS as compact JSON), name a JSON Schema version
    jsonschema knows (or none: the latest), refer only to parts of itself (a "$ref" starting with "#", so that
    checking never fetches anything from the network, and to a part that exists), and its regular expressions
    ("pattern" values, "patternProperties" names) follow the rules of regex checks. The walk is by key name, so it
    also looks at data such as "enum" values: a conservative refusal, rare in practice."""
    if not isinstance(schema, dict):
        return [f'"schema" must be an object (a JSON Schema), not {kind_of_value(schema)}']
    try:
        size = len(json.dumps(schema, ensure_ascii=False, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        return ['"schema" must contain only JSON values']
    if size > MAX_SCHEMA_CHARS:
        return [f'"schema" is too long: {size:,} characters as JSON, at most {MAX_SCHEMA_CHARS:,}']
    declared = schema.get("$schema")
    if "$schema" in schema and (not isinstance(declared, str) or validators.validator_for(schema, None) is None):
        return [f'"$schema" {show(declared)} is not a JSON Schema version this panel knows: leave it out (the latest '
                f'version is used) or use e.g. "https://json-schema.org/draft/2020-12/schema"']
    problems, local_refs, nested_ids = _schema_walk(schema)
    if problems:
        return problems
    validator_class = validators.validator_for(schema)
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as error:
        where = f" (at {error.json_path})" if error.absolute_path else ""
        return [f"the schema is not a valid JSON Schema: {cut(error.message, 200)}{where}"]
    except RecursionError:
        return ["the schema is nested too deeply"]
    if nested_ids:  # a "#..." below a nested "$id" is relative to that part: left to run time (checks.run_check)
        return []
    return _missing_ref_problems(schema, validator_class, local_refs)


def _schema_walk(schema):
    """Walk the whole schema (iteratively: it may nest deeply) for references and regular expressions.

    Returns the problems found, the "$ref"s within the schema, and whether a part below the top has its own "$id"
    (or "id", of old drafts)."""
    problems, local_refs, nested_ids = [], [], False
    pending = [(schema, True)]
    while pending:
        node, top = pending.pop()
        if isinstance(node, list):
            pending.extend((item, False) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        nested_ids = nested_ids or (not top and any(isinstance(node.get(key), str) for key in ("$id", "id")))
        for key in ("$ref", "$dynamicRef", "$recursiveRef"):
            if isinstance(node.get(key), str) and not node[key].startswith("#"):
                problems.append("the schema may only refer to itself ($ref starting with #)")
        if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
            local_refs.append(node["$ref"])
        patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        if isinstance(node.get("patternProperties"), dict):
            patterns += [name for name in node["patternProperties"] if isinstance(name, str)]
        for pattern in patterns:
            problems += pattern_problems(pattern, name=f"the schema's pattern /{cut(pattern, 80)}/")
        pending.extend((value, False) for value in node.values())
    return list(dict.fromkeys(problems)), local_refs, nested_ids  # each problem once


def _missing_ref_problems(schema, validator_class, refs):
    """A "$ref" to a part the schema does not have (a typo in "#/$defs/adress") would only show when an answer
    reaches it: found here instead, with the resolver jsonschema itself uses."""
    specification = referencing.jsonschema.specification_with(validator_class.META_SCHEMA["$schema"])
    resolver = referencing.Registry().resolver_with_root(specification.create_resource(schema))
    problems = []
    for ref in dict.fromkeys(refs):
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            problems.append(f'the schema refers to "{cut(ref, 80)}", which it does not contain')
    return problems


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


# ---------------------------------------------------------------------------------------------------------------------
# Words about a wrong value (checks.py uses them too)
# ---------------------------------------------------------------------------------------------------------------------

def cut(text, limit):
    """The text, at most `limit` characters: a longer one ends with "…"."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def show(value):
    """A value as the team wrote it in JSON, cut (for words about a wrong value)."""
    try:
        return cut(json.dumps(value, ensure_ascii=False), 60)
    except (TypeError, ValueError):
        return cut(repr(value), 60)


def kind_of_value(value):
    """What a JSON value is, in the words of JSON: 'a number', 'a list', 'true'…"""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"
