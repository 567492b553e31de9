"""json.loads for text from outside (request bodies, uploads, upstream answers): a document nested past the
parser's stack ([[[[...) raises `NestedTooDeep`, a ValueError like every other invalid document, instead of the
RecursionError that would otherwise escape as a 500.

Both directions go through orjson first, whose parse and serialisation cost a fraction of the standard library's
(an event of a relayed stream is parsed and written again: that was a tenth of the gateway's CPU per chunk). What
orjson refuses and the standard library takes (NaN, integers past 64 bits, lone surrogates, UTF-16 bytes, Decimal,
a subclass it does not know) goes the standard library's way, so a document reads and writes as it did before;
`dumps` writes compact UTF-8 rather than ASCII escapes, which any JSON reader takes."""
import json

import orjson


class NestedTooDeep(ValueError):
    """Valid-looking JSON nested deeper than the parser's stack: no client could parse it either."""


def loads(data, **options):
    if not options:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # the standard library's verdict, or what it accepts beyond RFC 8259
    try:
        return json.loads(data, **options)
    except RecursionError as error:
        raise NestedTooDeep(str(error)) from None


def dumps(value):
    """`value` as JSON bytes."""
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(value).encode()
