"""What a team's pattern or JSON Schema may be: the checks of regular expressions (of regex checks and of "pattern"
keywords in schemas) and of the JSON Schemas of json_schema checks, before they are stored.

A regular expression follows panel/core/regexes.py (capped in length, no repetition that can backtrack for ever:
Python's re has no timeout). A schema is capped in size, must name a JSON Schema version
jsonschema knows, may refer only to parts of itself, and its regular expressions follow the same rules.
pattern_problems() and schema_problems() say what is wrong in words for the team; regex_flags() turns the flag
letters of a regex check into re flags. Pure Python: no database, no network."""
import json

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema import validators

from panel.core.regexes import (  # noqa: F401  (re-exported for the checks)
    MAX_PATTERN_CHARS,
    NESTED_REPETITION,
    REGEX_FLAGS,
    REPEATED_ALTERNATIVES,
    VERBOSE_PATTERN,
    pattern_problems,
    regex_flags,
)

MAX_SCHEMA_CHARS = 20_000  # the schema as compact JSON


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
