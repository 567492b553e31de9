"""What a team's pattern or JSON Schema may be: the checks of regular expressions (of regex checks and of "pattern"
keywords in schemas) and of the JSON Schemas of json_schema checks, before they are stored.

A regular expression is compiled and run by panel/core/regexes.py (RE2: no backtracking, capped in length). A
schema is capped in size, must name a JSON Schema version jsonschema knows, may refer only to parts of itself, and
its regular expressions follow the same rules: schema_validator() gives jsonschema's validator with its "pattern",
"patternProperties" and "additionalProperties" keywords run by RE2 (jsonschema's own run Python's re), and the
schema's own check leaves out the "regex" format, which would compile the patterns with Python's re.
pattern_problems() and schema_problems() say what is wrong in words for the team. Pure Python: no database, no
network."""
import functools
import json

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema import validators
from jsonschema.exceptions import ValidationError

from panel.core.regexes import (  # noqa: F401  (re-exported for the checks)
    MAX_PATTERN_CHARS,
    REGEX_FLAGS,
    VERBOSE_PATTERN,
    PatternError,
    pattern_problems,
    regex_search,
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
        validator_class.check_schema(schema, format_checker=_schema_format_checker(validator_class))
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
    pattern_properties = unevaluated = False
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
            pattern_properties = True
        unevaluated = unevaluated or "unevaluatedProperties" in node
        for pattern in patterns:
            problems += pattern_problems(pattern, name=f"the schema's pattern /{cut(pattern, 80)}/")
        pending.extend((value, False) for value in node.values())
    if pattern_properties and unevaluated:  # jsonschema would match those names with Python's re
        problems.append('the schema uses "patternProperties" with "unevaluatedProperties", which checks do not '
                        'support together: name the properties, or use "additionalProperties"')
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


def schema_validator(schema):
    """jsonschema's validator for a valid schema (schema_problems(schema) == []), its regular expressions run by RE2
    and its references only within itself."""
    return _validator_class(validators.validator_for(schema))(schema, registry=referencing.Registry())


@functools.cache
def _validator_class(validator_class):
    return validators.extend(validator_class, {"pattern": _pattern, "patternProperties": _pattern_properties,
                                               "additionalProperties": _additional_properties})


@functools.cache
def _schema_format_checker(validator_class):
    """The format checker of the schema's own check, less "regex" (Python's re.compile of every pattern, which
    _schema_walk has already checked with RE2)."""
    meta = validators.validator_for(validator_class.META_SCHEMA, default=validator_class)
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers = {name: check for name, check in meta.FORMAT_CHECKER.checkers.items() if name != "regex"}
    return checker


def _unusable(patterns):
    """The ValidationError of each pattern that cannot be run (saved before RE2 refused it: no answer matches it)."""
    for pattern in patterns:
        for problem in pattern_problems(pattern, name=f"the schema's pattern /{cut(pattern, 80)}/"):
            yield ValidationError(problem)


def _pattern(validator, pattern, instance, schema):
    if not validator.is_type(instance, "string"):
        return
    if pattern_problems(pattern):
        yield from _unusable([pattern])
    elif not regex_search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator, pattern_properties, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    yield from _unusable(pattern_properties)
    for pattern, subschema in pattern_properties.items():
        if pattern_problems(pattern):
            continue
        for name, value in instance.items():
            if regex_search(pattern, name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(validator, additional, instance, schema):
    """jsonschema's additionalProperties, with the names of patternProperties matched by RE2 (a pattern that cannot
    be run matches no name: patternProperties says why)."""
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = [pattern for pattern in schema.get("patternProperties", {}) if not pattern_problems(pattern)]
    extras = [name for name in instance if name not in properties
              and not any(regex_search(pattern, name) for pattern in patterns)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        names = ", ".join(repr(name) for name in sorted(extras, key=str))
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            yield ValidationError(f"{names} {verb} not match any of the regexes: "
                                  f"{', '.join(repr(pattern) for pattern in sorted(schema['patternProperties']))}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({names} {verb} unexpected)")


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
