"""Request tags as the gateway, the budgets and the usage export read them: cleaned, bounded, kept as "|a|b|"."""
import pytest

from panel.usage.tags import MAX_TAG_CHARS, MAX_TAGS, TagError, split_list, tags_clean, tags_read, tags_stored


def test_tags_are_kept_in_lower_case_once_each_in_the_order_given():
    assert tags_clean(["Search", "team:ml", "search", "cost-center=42", "v1.2/beta"]) == [
        "search", "team:ml", "cost-center=42", "v1.2/beta"]
    assert split_list(" a, b ,,c, ") == ["a", "b", "c"]
    assert tags_stored(["a", "b"]) == "|a|b|" and tags_stored([]) is None
    assert tags_read("|a|b|") == ["a", "b"] and tags_read(None) == []


@pytest.mark.parametrize("values, words", [
    ([""], "is not a tag"),
    (["has space"], "is not a tag"),
    (["pipe|inside"], "is not a tag"),
    (["-leading"], "is not a tag"),
    (["x" * (MAX_TAG_CHARS + 1)], "is not a tag"),
    ([7], "tags must be strings, not int"),
    ([f"t{i}" for i in range(MAX_TAGS + 1)], f"at most {MAX_TAGS} tags, not {MAX_TAGS + 1}"),
])
def test_a_bad_tag_or_too_many_are_refused_with_the_reason(values, words):
    with pytest.raises(TagError, match=words):
        tags_clean(values)
