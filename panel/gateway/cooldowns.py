"""Channel cooldowns: after a few consecutive failed requests a channel rests, and requests try it last."""
import time

COOLDOWN_AFTER_FAILURES = 3
COOLDOWN_SECONDS = 30.0


class Cooldown:
    """Consecutive failures per channel in this process; after a few, the channel rests and is probed later."""

    seconds = COOLDOWN_SECONDS

    def __init__(self):
        self.failures = {}
        self.until = {}

    def cooled(self, channel_id):
        return self.until.get(channel_id, 0) > time.monotonic()

    async def order(self, targets):
        """Cooled-down channels go last: they are tried only when everything else failed (that is their probe)."""
        return sorted(targets, key=lambda target: self.cooled(target.id))

    async def failed(self, channel_id):
        """Count a failure: (consecutive failures, True when it starts a cooldown)."""
        count = self.failures.get(channel_id, 0) + 1
        self.failures[channel_id] = count
        if count >= COOLDOWN_AFTER_FAILURES:
            began = not self.cooled(channel_id)
            self.until[channel_id] = time.monotonic() + COOLDOWN_SECONDS
            return count, began
        return count, False

    async def succeeded(self, channel_id):
        self.failures.pop(channel_id, None)
        self.until.pop(channel_id, None)


COOLDOWN = Cooldown()
