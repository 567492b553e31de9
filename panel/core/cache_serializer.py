"""The Django cache's serializer: JSON, never pickle. Django's default Redis serializer unpickles whatever the cache
key holds, so anyone who can write to that Redis could run code as the panel; a JSON value can only be data.

Whole numbers are stored as they are, as Django's own serializer does, so that incr() stays atomic in Redis."""
import json


class JsonSerializer:
    def dumps(self, obj):
        if type(obj) is int:  # not bool, which json writes as true/false
            return obj
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(self, data):
        try:
            return int(data)
        except ValueError:
            return json.loads(data)  # a value that is not JSON raises ValueError: never run, never trusted
