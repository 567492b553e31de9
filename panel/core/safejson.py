"""json.loads for text from outside (request bodies, uploads, upstream answers): a document nested past the
parser's stack ([[[[...) raises `NestedTooDeep`, a ValueError like every other invalid document, instead of the
RecursionError that would otherwise escape as a 500."""
import json


class NestedTooDeep(ValueError):
    """Valid-looking JSON nested deeper than the parser's stack: no client could parse it either."""


def loads(data, **options):
    try:
        return json.loads(data, **options)
    except RecursionError as error:
        raise NestedTooDeep(str(error)) from None
