"""Request tags: labels a client puts on a gateway request (a feature, a project, a customer) so that spend can be
budgeted and shown per tag. Sent in the `x-tokenwise-tags` header (comma-separated) or in the body's `metadata.tags`
(a list of strings, or one comma-separated string, since OpenAI's SDKs type metadata values as strings); the gateway
takes them out of the body before it goes upstream.

A tag is 1 to 64 characters of lower-case letters, digits and `-_.:/=` (sent in any case, kept in lower case, so
"Search" and "search" are one tag); a request carries at most MAX_TAGS. A usage record keeps them as "|a|b|", so that
"every record of tag a" is one LIKE on either database.

A team uses at most TOKENWISE_TEAM_TAGS_PER_DAY distinct tags a day (UTC; counted in Redis): past it a request with a
tag not yet seen that day is refused (400), so a client cannot grow the tag rollups and budgets without bound. A
Redis outage lets the tags through, as it lets the rest of admission (decision 0028)."""
import logging
import re
import time

from django.conf import settings
from redis.exceptions import RedisError

from panel.core.redis_client import registered_script

HEADER = "x-tokenwise-tags"
MAX_TAGS = 8
MAX_TAG_CHARS = 64
TAG_PATTERN = re.compile(r"^[a-z0-9][a-z0-9\-_.:/=]*$")
RULE = (f"a tag is 1 to {MAX_TAG_CHARS} characters of letters, digits and - _ . : / =, starting with a letter or "
        "a digit")


log = logging.getLogger(__name__)

# KEYS[1]: the team's set of the day's tags; ARGV: the cap, then the request's tags. Returns the first tag refused,
# or "" (the new ones then added).
ADMIT_TAGS = """
local cap = tonumber(ARGV[1])
local fresh = {}
for i = 2, #ARGV do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 0 then table.insert(fresh, ARGV[i]) end
end
if #fresh == 0 then return '' end
if redis.call('SCARD', KEYS[1]) + #fresh > cap then return fresh[1] end
redis.call('SADD', KEYS[1], unpack(fresh))
redis.call('EXPIRE', KEYS[1], 172800)
return ''
"""


class TagError(ValueError):
    """Tags that cannot be accepted; the message says which and why."""


def tag_clean(raw):
    """One tag as kept (lower case), or TagError."""
    if not isinstance(raw, str):
        raise TagError(f"tags must be strings, not {type(raw).__name__}")
    tag = raw.strip().lower()
    if not tag or len(tag) > MAX_TAG_CHARS or not TAG_PATTERN.match(tag):
        shown = raw[:MAX_TAG_CHARS + 1] + ("…" if len(raw) > MAX_TAG_CHARS + 1 else "")
        raise TagError(f"{shown!r} is not a tag: {RULE}")
    return tag


def tags_clean(values):
    """Tags as kept: cleaned, duplicates dropped, in the order given; TagError for a bad one or too many."""
    tags = []
    for value in values:
        tag = tag_clean(value)
        if tag not in tags:
            tags.append(tag)
    if len(tags) > MAX_TAGS:
        raise TagError(f"a request carries at most {MAX_TAGS} tags, not {len(tags)}")
    return tags


def split_list(text):
    """The tags of a comma-separated string (empty pieces ignored, so "a, b," is two tags)."""
    return [piece for piece in (part.strip() for part in text.split(",")) if piece]


async def tags_admit(team_id, tags):
    """Count the request's tags among its team's tags of the day; TagError when one is new and the day's are all
    used."""
    if not tags:
        return
    cap = settings.TEAM_TAGS_PER_DAY
    day = time.strftime("%Y%m%d", time.gmtime())
    try:
        refused = await registered_script(ADMIT_TAGS)(keys=[f"tw:tags:{team_id}:{day}"], args=[cap, *tags])
    except (RedisError, OSError) as error:
        log.warning("tags of team %s not counted (%s): let through", team_id, type(error).__name__)
        return
    if refused:
        refused = refused.decode() if isinstance(refused, bytes) else refused
        raise TagError(f"this team has used its {cap:,} distinct tags of the day (UTC), and {refused!r} would be "
                       "one more: reuse one of today's tags, or send the request without it")


def tags_stored(tags):
    """The usage record's column for `tags`: "|a|b|", or None for none."""
    return f"|{'|'.join(tags)}|" if tags else None


def tags_read(stored):
    """The tags of a usage record's column."""
    return [tag for tag in (stored or "").split("|") if tag]


def tag_lookup(tag):
    """The filter keyword for the usage records of `tag` (a cleaned tag): `RequestLog.objects.filter(**...)`."""
    return {"tags__contains": f"|{tag}|"}
