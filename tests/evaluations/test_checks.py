"""The checks of evaluation sets (panel/evaluations/checks.py): validation of a check as uploaded, running it on an
answer, its description, and the word-level similarity of "agrees". Pure functions: no database, no network."""
import dataclasses
import time

import pytest

from panel.evaluations.checks import (
    KINDS,
    MAX_ANSWER_CHARS,
    MAX_CHECKS_PER_CASE,
    MAX_PATTERN_CHARS,
    CheckResult,
    check_problems,
    describe,
    run_check,
    similarity,
)

BACKREFERENCE = ("the pattern refers back to a group (like \\1 or (?P=name)), which patterns here run without "
                 "backtracking, so that no text can make them slow: match the text again instead")
ORDER_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "items": {"type": "array", "items": {"type": "integer"}}},
    "required": ["name"],
}


def test_kinds_and_limits_are_the_documented_ones():
    assert KINDS == ("json", "json_schema", "regex", "contains", "exact", "agrees", "judge")
    assert (MAX_CHECKS_PER_CASE, MAX_PATTERN_CHARS, MAX_ANSWER_CHARS) == (10, 500, 20_000)


# --- check_problems -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [
    {"type": "json"},
    {"type": "json_schema", "schema": ORDER_SCHEMA},
    {"type": "json_schema",
     "schema": {"$defs": {"n": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/n"}}}},
    {"type": "json_schema", "schema": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array"}},
    {"type": "json_schema", "schema": {"type": "string", "pattern": r"^\d{4}-\d{2}$"}},
    {"type": "regex", "pattern": r"\d{4}-\d{2}-\d{2}"},
    {"type": "regex", "pattern": "^paris$", "flags": "ims"},
    {"type": "regex", "pattern": "x", "flags": ""},
    {"type": "contains", "text": "Paris"},
    {"type": "contains", "text": "Paris", "case_sensitive": True},
    {"type": "exact", "text": "42", "case_sensitive": False},
    {"type": "agrees", "channel": "taotoken"},
    {"type": "agrees", "channel": "taotoken", "min_similarity": 1},
    {"type": "agrees", "channel": "taotoken", "min_similarity": 0.01},
    {"type": "agrees", "answer": "The capital of France is Paris.", "min_similarity": 0.5},
    {"type": "judge", "channel": "gpt-judge", "criteria": "Cites the refund policy."},
], ids=lambda spec: spec["type"])
def test_a_valid_check_has_no_problems(spec):
    assert check_problems(spec) == []


@pytest.mark.parametrize("spec, field, words", [
    (["json"], "object", 'a check is an object such as {"type": "json"}'),
    ("json", "object", 'a check is an object such as {"type": "json"}'),
    ({}, '"type"', "json, json_schema, regex, contains, exact, agrees, judge"),
    ({"type": "xml"}, '"type"', '"xml" is not a kind of check: use one of json, json_schema, regex, contains'),
    ({"type": 3}, '"type"', "is not a kind of check"),
    ({"type": "JSON"}, '"type"', "is not a kind of check"),
    ({"type": "contains", "text": "a", "case_sensitve": True}, '"case_sensitve"',
     'unknown field "case_sensitve" for a "contains" check (it takes "text" and "case_sensitive")'),
    ({"type": "json", "schema": {}, "strict": True}, '"schema"', 'unknown fields "schema", "strict"'),
    ({"type": "json_schema"}, '"schema"', 'needs "schema"'),
    ({"type": "json_schema", "schema": "object"}, '"schema"', "must be an object (a JSON Schema), not a string"),
    ({"type": "json_schema", "schema": True}, '"schema"', "must be an object"),
    ({"type": "json_schema", "schema": {"type": "integr"}}, "schema",
     "the schema is not a valid JSON Schema: 'integr' is not valid under any of the given schemas (at $.type)"),
    ({"type": "json_schema", "schema": {"properties": {"a": {"$ref": "https://example.com/a.json"}}}}, "$ref",
     "the schema may only refer to itself ($ref starting with #)"),
    ({"type": "json_schema", "schema": {"$ref": "other.json#/x"}}, "$ref", "may only refer to itself"),
    ({"type": "json_schema", "schema": {"$ref": "#/$defs/adress"}}, "schema",
     'the schema refers to "#/$defs/adress", which it does not contain'),
    ({"type": "json_schema", "schema": {"enum": ["x" * 100] * 200}}, '"schema"',
     "is too long: 20,610 characters as JSON, at most 20,000"),
    ({"type": "json_schema", "schema": {"$schema": "https://example.com/my-draft"}}, '"$schema"',
     "is not a JSON Schema version this panel knows"),
    ({"type": "json_schema", "schema": {"properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}}}, "pattern",
     "the schema's pattern /(?<=a)b/ looks ahead or behind"),
    ({"type": "json_schema", "schema": {"patternProperties": {"(x)\\1": {}}}}, "pattern",
     "the schema's pattern /(x)\\1/ refers back to a group"),
    ({"type": "json_schema", "schema": {"patternProperties": {"x": {}}, "unevaluatedProperties": False}},
     "patternProperties", 'uses "patternProperties" with "unevaluatedProperties"'),
    ({"type": "regex"}, '"pattern"', 'a "regex" check needs "pattern"'),
    ({"type": "regex", "pattern": 42}, '"pattern"', '"pattern" must be a string, not a number'),
    ({"type": "regex", "pattern": ""}, '"pattern"', '"pattern" is empty'),
    ({"type": "regex", "pattern": "a" * 501}, "pattern", "the pattern is too long: 501 characters, at most 500"),
    ({"type": "regex", "pattern": "(abc"}, "pattern",
     "the pattern is not a valid regular expression: missing ): (abc"),
    ({"type": "regex", "pattern": "(a)\\1"}, "pattern", BACKREFERENCE),
    ({"type": "regex", "pattern": "(?x)(a+) +"}, "pattern", "turns on verbose mode"),
    ({"type": "regex", "pattern": "a", "flags": ["i"]}, '"flags"', "must be a string of the letters i, m and s"),
    ({"type": "regex", "pattern": "a", "flags": "ix"}, '"flags"', 'may only contain the letters i, m and s (not "x")'),
    ({"type": "regex", "pattern": "a", "flags": "I"}, '"flags"', '(not "I")'),
    ({"type": "contains"}, '"text"', 'a "contains" check needs "text"'),
    ({"type": "contains", "text": ["Paris"]}, '"text"', "must be a string, not a list"),
    ({"type": "contains", "text": ""}, '"text"', '"text" is empty'),
    ({"type": "contains", "text": "x" * 2001}, '"text"', "is too long: 2,001 characters, at most 2,000"),
    ({"type": "contains", "text": "a", "case_sensitive": "false"}, '"case_sensitive"',
     "must be true or false, not a string"),
    ({"type": "exact"}, '"text"', 'an "exact" check needs "text"'),
    ({"type": "exact", "text": "  \n"}, '"text"', '"text" is empty'),
    ({"type": "exact", "text": "42", "case_sensitive": 1}, '"case_sensitive"', "must be true or false, not a number"),
    ({"type": "agrees"}, '"channel"', 'an "agrees" check needs "channel" (the channel whose answer is the reference) '
                                      'or "answer" (a recorded answer)'),
    ({"type": "agrees", "channel": "c", "answer": "a"}, '"answer"', 'takes "channel" or "answer" (the reference), '
                                                                    'not both'),
    ({"type": "agrees", "answer": " "}, '"answer"', '"answer" is empty'),
    ({"type": "agrees", "channel": None}, '"channel"', "must be a string, not null"),
    ({"type": "agrees", "channel": " "}, '"channel"', '"channel" is empty'),
    ({"type": "agrees", "channel": "c" * 101}, '"channel"', "is too long: 101 characters, at most 100"),
    ({"type": "agrees", "channel": "c", "min_similarity": True}, '"min_similarity"', "must be a number, not true"),
    ({"type": "agrees", "channel": "c", "min_similarity": "0.6"}, '"min_similarity"', "must be a number, not a string"),
    ({"type": "agrees", "channel": "c", "min_similarity": 0}, '"min_similarity"', "more than 0 and at most 1, not 0"),
    ({"type": "agrees", "channel": "c", "min_similarity": 1.5}, '"min_similarity"', "at most 1, not 1.5"),
    ({"type": "agrees", "channel": "c", "min_similarity": float("nan")}, '"min_similarity"', "at most 1, not nan"),
    ({"type": "judge", "criteria": "polite"}, '"channel"', 'a "judge" check needs "channel"'),
    ({"type": "judge", "channel": "gpt-judge"}, '"criteria"', 'a "judge" check needs "criteria"'),
    ({"type": "judge", "channel": "gpt-judge", "criteria": "c" * 2001}, '"criteria"', "is too long: 2,001 characters"),
])
def test_each_problem_is_one_sentence_naming_its_field(spec, field, words):
    problems = check_problems(spec)
    assert len(problems) == 1, problems
    assert field in problems[0]
    assert words in problems[0]
    assert "spec" not in problems[0]


def test_problems_of_several_fields_are_all_reported():
    problems = check_problems({"type": "agrees", "channel": "", "min_similarity": 2, "reference": "x"})
    assert problems == [
        'unknown field "reference" for an "agrees" check (it takes "channel", "answer" and "min_similarity")',
        '"channel" is empty',
        '"min_similarity" must be more than 0 and at most 1, not 2',
    ]


def test_a_check_without_type_lists_every_kind():
    (problem,) = check_problems({"pattern": "x"})
    assert all(kind in problem for kind in KINDS)


# --- patterns run without backtracking (RE2) ------------------------------------------------------------------------

@pytest.mark.parametrize("pattern", [
    "^(a+)+$", r"^(\w*)*$", "^((ab)+)+$", "^(a+){2,}$", "^(a*){1,5}$", "^(?:a+b)*$", "^(a|aa){2,}$", "^(a|a)*$",
    r"\w*\w*\w*\w*\w*\w*\w*\w*\w*\w*#",
])
def test_patterns_that_would_backtrack_are_accepted_and_run_in_linear_time(pattern):
    """Python's re took seconds to for ever on these; RE2 reads the answer once, so they need no refusal."""
    spec = {"type": "regex", "pattern": pattern}
    assert check_problems(spec) == []
    started = time.monotonic()
    assert not run_check(spec, "a" * (MAX_ANSWER_CHARS - 1) + "!").passed
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("pattern", [
    r"\d{4}-\d{2}", "(ab)+", "(a+)?", "(ab){3}", "a+b*c{2,}", r"\(a+\)+", "[(]a+[)]+", "[]a+(]+", r"(?i)paris",
    r"\{a+\}+", r"[a-z]+(\.[a-z]+)*", "(cat|dog)+", r"\p{L}+", r"end\z",
])
def test_ordinary_patterns_are_accepted(pattern):
    assert check_problems({"type": "regex", "pattern": pattern}) == []


@pytest.mark.parametrize("pattern, words", [
    ("(?=a)b", "looks ahead or behind (like (?=…), (?!…), (?<=…) or (?<!…)), which patterns here run without "
               "backtracking"),
    ("a(?!b)", "looks ahead or behind"),
    ("(?P<x>a)(?P=x)", "refers back to a group"),
    ("(?>a)b", "uses an atomic group or a possessive repetition"),
    ("a++", "uses an atomic group or a possessive repetition"),
    ("(?ix)a b", "turns on verbose mode ((?x))"),
    (r"end\Z", r"uses \Z, which patterns here do not support: write \z for the end of the text"),
    ("(?#note)a", "is not a valid regular expression"),
    ("x{1001}", "is not a valid regular expression: invalid repetition size"),
])
def test_what_the_engine_cannot_run_is_refused_in_words(pattern, words):
    (problem,) = check_problems({"type": "regex", "pattern": pattern})
    assert problem.startswith("the pattern ") and words in problem


def test_a_pattern_saved_before_it_was_refused_fails_the_check_in_words():
    assert run_check({"type": "regex", "pattern": "(?=a)a"}, "a") == CheckResult(
        False, "the pattern cannot be run: the pattern looks ahead or behind (like (?=…), (?!…), (?<=…) or (?<!…)), "
               "which patterns here run without backtracking, so that no text can make them slow: match the "
               "surrounding text instead")
    schema = {"type": "json_schema", "schema": {"properties": {"a": {"pattern": "(a)\\1"}}}}
    result = run_check(schema, '{"a": "aa"}')
    assert not result.passed and "the schema's pattern /(a)\\1/ refers back to a group" in result.words


def test_schema_pattern_properties_and_additional_properties_match_names_with_re2():
    spec = {"type": "json_schema", "schema": {"type": "object", "patternProperties": {"^x_\\d+$": {"type": "integer"}},
                                              "additionalProperties": False}}
    assert run_check(spec, '{"x_1": 1, "x_22": 2}').passed
    assert run_check(spec, '{"x_1": "one"}') == CheckResult(False, "at $.x_1: 'one' is not of type 'integer'")
    assert run_check(spec, '{"y": 1}') == CheckResult(
        False, "at $: 'y' does not match any of the regexes: '^x_\\\\d+$'")
    plain = {"type": "json_schema", "schema": {"properties": {"a": {}}, "additionalProperties": False}}
    assert run_check(plain, '{"a": 1, "b": 2}') == CheckResult(
        False, "at $: Additional properties are not allowed ('b' was unexpected)")


def test_regex_flags_are_run_by_re2_too():
    assert check_problems({"type": "regex", "pattern": "(?=x)", "flags": "i"})[0].startswith("the pattern looks")
    assert run_check({"type": "regex", "pattern": "é+", "flags": "i"}, "ÉÉ").passed


# --- run_check: every kind, passing and failing ---------------------------------------------------------------------

def _judge_yes(criteria, answer):
    return True, f"meets: {criteria}"


def _judge_no(criteria, answer):
    return False, "it does not cite the policy"


@pytest.mark.parametrize("spec, answer, options, passed, words", [
    ({"type": "json"}, '{"a": [1, 2]}', {}, True, "valid JSON"),
    ({"type": "json"}, "  42\n", {}, True, "valid JSON"),
    ({"type": "json"}, "The answer is 42.", {}, False, "not JSON: Expecting value at line 1 column 1"),
    ({"type": "json"}, '{"a": 1', {}, False, "not JSON: Expecting ',' delimiter at line 1 column 8"),
    ({"type": "json"}, "", {}, False, "not JSON: the answer is empty"),
    ({"type": "json"}, "NaN", {}, False, "not JSON: NaN is not allowed in JSON"),
    ({"type": "json_schema", "schema": ORDER_SCHEMA}, '{"name": "x", "items": [1, 2]}', {}, True,
     "matches the JSON schema"),
    ({"type": "json_schema", "schema": ORDER_SCHEMA}, '{"name": "x", "items": ["x"]}', {}, False,
     "at $.items[0]: 'x' is not of type 'integer'"),
    ({"type": "json_schema", "schema": ORDER_SCHEMA}, '{"items": []}', {}, False,
     "at $: 'name' is a required property"),
    ({"type": "json_schema", "schema": ORDER_SCHEMA}, "name: x", {}, False,
     "not JSON: Expecting value at line 1 column 1"),
    ({"type": "regex", "pattern": r"\d{4}-\d{2}-\d{2}"}, "Due 2024-05-01.", {}, True, r"matched /\d{4}-\d{2}-\d{2}/"),
    ({"type": "regex", "pattern": r"\d{4}-\d{2}-\d{2}"}, "Due May 1st.", {}, False,
     r"no match for /\d{4}-\d{2}-\d{2}/"),
    ({"type": "contains", "text": "Paris"}, "the capital is PARIS.", {}, True, 'contains "Paris"'),
    ({"type": "contains", "text": "Paris", "case_sensitive": True}, "the capital is PARIS.", {}, False,
     'does not contain "Paris"'),
    ({"type": "contains", "text": "Paris", "case_sensitive": True}, "It is Paris.", {}, True, 'contains "Paris"'),
    ({"type": "contains", "text": "Paris"}, "It is Lyon.", {}, False, 'does not contain "Paris"'),
    ({"type": "exact", "text": "42"}, " 42\n", {}, True, 'is exactly "42"'),
    ({"type": "exact", "text": "42"}, "43", {}, False, 'is "43", not exactly "42"'),
    ({"type": "exact", "text": "Yes"}, "yes", {}, False, 'is "yes", not exactly "Yes"'),
    ({"type": "exact", "text": "Yes", "case_sensitive": False}, "YES", {}, True, 'is exactly "Yes"'),
    ({"type": "agrees", "channel": "ref"}, "cat sat down", {"reference": "The cat sat"}, True,
     "agrees 0.80 with the reference (needs 0.60)"),
    ({"type": "agrees", "channel": "ref", "min_similarity": 0.8}, "cat sat down", {"reference": "The cat sat"}, True,
     "agrees 0.80 with the reference (needs 0.80)"),
    ({"type": "agrees", "channel": "ref", "min_similarity": 0.81}, "cat sat down", {"reference": "The cat sat"}, False,
     "agrees only 0.80 with the reference (needs 0.81)"),
    ({"type": "agrees", "channel": "ref"}, "x y z", {"reference": "x q w"}, False,
     "agrees only 0.33 with the reference (needs 0.60)"),
    ({"type": "judge", "channel": "j", "criteria": "polite"}, "Hello!", {"judge": _judge_yes}, True, "meets: polite"),
    ({"type": "judge", "channel": "j", "criteria": "cites the policy"}, "No.", {"judge": _judge_no}, False,
     "it does not cite the policy"),
])
def test_run_check(spec, answer, options, passed, words):
    assert check_problems(spec) == []
    assert run_check(spec, answer, **options) == CheckResult(passed, words)


@pytest.mark.parametrize("answer", [None, 42, ["a"]])
def test_an_answer_that_is_not_text_counts_as_empty(answer):
    assert run_check({"type": "json"}, answer) == CheckResult(False, "not JSON: the answer is empty")
    assert not run_check({"type": "contains", "text": "a"}, answer).passed
    assert run_check({"type": "regex", "pattern": "^$"}, answer).passed


def test_check_results_cannot_be_changed():
    result = run_check({"type": "json"}, "{}")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.passed = False


# --- the code-fence rule ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("answer", [
    '```json\n{"a": 1}\n```',
    "```\n[1, 2]\n```",
    '  ```JSON\n{"a": 1}\n```\n ',
    '```json\r\n{"a": 1}\r\n```',
    '```json\n{"a": 1}```',
])
def test_json_in_a_single_code_fence_is_accepted(answer):
    assert run_check({"type": "json"}, answer) == CheckResult(True, "valid JSON")


@pytest.mark.parametrize("answer", [
    '```python\n{"a": 1}\n```',
    'Here it is:\n```json\n{"a": 1}\n```',
    '```json\n{"a": 1}\n```\nand\n```json\n{"b": 2}\n```',
    '```json\n{"a": 1}\n',
])
def test_json_around_or_in_other_fences_is_refused(answer):
    result = run_check({"type": "json"}, answer)
    assert not result.passed
    assert result.words.startswith("not JSON: ")


def test_the_code_fence_rule_holds_for_schemas_too():
    spec = {"type": "json_schema", "schema": ORDER_SCHEMA}
    assert run_check(spec, '```json\n{"name": "x"}\n```').passed
    assert run_check(spec, '```json\n{"name": 1}\n```') == CheckResult(False, "at $.name: 1 is not of type 'string'")


# --- regex flags -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, flags, answer", [
    ("paris", "i", "PARIS"),
    ("^b$", "m", "a\nb\nc"),
    ("a.b", "s", "a\nb"),
])
def test_regex_flags(pattern, flags, answer):
    without = run_check({"type": "regex", "pattern": pattern}, answer)
    with_flags = run_check({"type": "regex", "pattern": pattern, "flags": flags}, answer)
    assert without == CheckResult(False, f"no match for /{pattern}/")
    assert with_flags == CheckResult(True, f"matched /{pattern}/{flags}")


# --- the answer is cut at MAX_ANSWER_CHARS --------------------------------------------------------------------------

def test_a_match_only_after_the_limit_is_not_found():
    spec = {"type": "regex", "pattern": "needle"}
    assert run_check(spec, "x" * (MAX_ANSWER_CHARS - 6) + "needle").passed
    result = run_check(spec, "x" * MAX_ANSWER_CHARS + "needle")
    assert result == CheckResult(False, "no match for /needle/ (only the first 20,000 characters of the answer were "
                                        "checked)")
    assert not run_check({"type": "contains", "text": "needle"}, "x" * (MAX_ANSWER_CHARS - 3) + "needle").passed


def test_a_long_json_answer_is_cut_before_parsing():
    answer = "[" + ",".join(["1"] * MAX_ANSWER_CHARS) + "]"
    result = run_check({"type": "json"}, answer)
    assert not result.passed
    assert result.words.endswith("(only the first 20,000 characters of the answer were checked)")


def test_a_passing_check_on_a_cut_answer_does_not_mention_the_cut():
    assert run_check({"type": "contains", "text": "x"}, "x" * (MAX_ANSWER_CHARS + 10)) == CheckResult(
        True, 'contains "x"')


# --- agrees and judge without what they need -------------------------------------------------------------------------

def test_agrees_without_a_reference_fails_saying_so():
    result = run_check({"type": "agrees", "channel": "taotoken"}, "cat sat", reference=None)
    assert not result.passed
    assert "reference answer is missing" in result.words
    assert "taotoken" in result.words


def test_agrees_with_a_recorded_answer_needs_no_channel():
    spec = {"type": "agrees", "answer": "The capital of France is Paris.", "min_similarity": 0.5}
    assert run_check(spec, "Paris is the capital of France.") == CheckResult(
        True, "agrees 1.00 with the reference (needs 0.50)")
    assert not run_check(spec, "I do not know.", reference="ignored: the recorded answer is the reference").passed


def test_agrees_with_an_empty_reference_and_an_empty_answer_passes():
    assert run_check({"type": "agrees", "channel": "c"}, "", reference="").passed


def test_judge_without_a_judge_fails_saying_so():
    result = run_check({"type": "judge", "channel": "gpt-judge", "criteria": "polite"}, "Hello")
    assert not result.passed
    assert "no judge channel was asked" in result.words


def test_judge_gets_the_criteria_and_the_cut_answer():
    calls = []

    def judge(criteria, answer):
        calls.append((criteria, answer))
        return 1, ""

    spec = {"type": "judge", "channel": "gpt-judge", "criteria": "Cites the refund policy."}
    result = run_check(spec, "y" * (MAX_ANSWER_CHARS + 5), judge=judge)
    assert calls == [("Cites the refund policy.", "y" * MAX_ANSWER_CHARS)]
    assert result == CheckResult(True, "the judge approved the answer")


def test_judge_words_are_kept_short():
    result = run_check({"type": "judge", "channel": "j", "criteria": "c"}, "a",
                       judge=lambda criteria, answer: (False, "no " * 200))
    assert not result.passed
    assert len(result.words) == 300
    assert result.words.endswith("…")


# --- similarity ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("answer, reference, expected", [
    ("The cat sat", "cat sat down", 0.8),  # [cat, sat] vs [cat, sat, down]: precision 1, recall 2/3
    ("cat sat down", "The cat sat", 0.8),
    ("Paris.", "paris", 1.0),
    ("An apple, a pear!", "apple pear", 1.0),
    ("don't stop", "dont stop", 1.0),  # punctuation is removed, not replaced by a space
    ("Paris。", "Paris", 1.0),  # Unicode punctuation too
    ("red red blue", "red blue blue", 2 * 2 / 6),  # multisets: one red and one blue in common
    ("x y z", "x q w", 2 * 1 / 6),
    ("", "", 1.0),
    ("the", "a an", 1.0),  # both empty once the articles are removed
    ("", "Paris", 0.0),
    ("Paris", "...", 0.0),
    ("Paris", "Lyon", 0.0),
    ("theatre tickets", "the tickets", 2 * 1 / 3),  # "the" is removed as a word only: [theatre, tickets] vs [tickets]
])
def test_similarity(answer, reference, expected):
    assert similarity(answer, reference) == pytest.approx(expected)


def test_similarity_of_text_and_nothing():
    assert similarity(None, "") == 1.0
    assert similarity("Paris", None) == 0.0


# --- describe --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, words", [
    ({"type": "json"}, "valid JSON"),
    ({"type": "json_schema", "schema": {"properties": {"a": {}, "b": {}, "c": {}}}},
     "matches the JSON schema (3 properties)"),
    ({"type": "json_schema", "schema": {"properties": {"a": {}}}}, "matches the JSON schema (1 property)"),
    ({"type": "json_schema", "schema": {"type": "array"}}, "matches the JSON schema"),
    ({"type": "regex", "pattern": r"\d{4}"}, r"matches /\d{4}/"),
    ({"type": "regex", "pattern": "paris", "flags": "i"}, "matches /paris/i"),
    ({"type": "contains", "text": "Paris"}, 'contains "Paris"'),
    ({"type": "contains", "text": "Paris", "case_sensitive": True}, 'contains "Paris" (case-sensitive)'),
    ({"type": "exact", "text": "42"}, 'is exactly "42"'),
    ({"type": "exact", "text": "yes", "case_sensitive": False}, 'is exactly "yes" (ignoring case)'),
    ({"type": "agrees", "channel": "taotoken"}, "agrees with channel taotoken (word F1 ≥ 0.6)"),
    ({"type": "agrees", "channel": "taotoken", "min_similarity": 0.75},
     "agrees with channel taotoken (word F1 ≥ 0.75)"),
    ({"type": "agrees", "answer": "The capital of France is Paris.", "min_similarity": 0.5},
     'agrees with the recorded answer "The capital of France is Paris." (word F1 ≥ 0.5)'),
    ({"type": "judge", "channel": "gpt-judge", "criteria": "Polite and short."},
     "judged by channel gpt-judge: Polite and short."),
    ({"type": "judge", "channel": "gpt-judge", "criteria": "c" * 100},
     "judged by channel gpt-judge: " + "c" * 79 + "…"),
    ({"type": "regex"}, "a check that is not valid"),
    ({"type": "xml"}, "a check that is not valid"),
    ("json", "a check that is not valid"),
])
def test_describe(spec, words):
    assert describe(spec) == words


def test_a_reference_the_upload_could_not_verify_fails_the_check_instead_of_raising():
    # Below a nested "$id", a "#..." is relative to that part: check_problems leaves it to run time.
    spec = {"type": "json_schema", "schema": {"properties": {"x": {"$id": "https://example.com/x", "$ref": "#/nope"}}}}
    assert check_problems(spec) == []
    result = run_check(spec, '{"x": 1}')
    assert not result.passed
    assert result.words.startswith("the schema refers to a part of itself that does not exist")
