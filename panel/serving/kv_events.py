"""An engine's KV-cache events (vLLM's `--kv-events-config`), which a route balanced by them reads
(gateway/kv_events.py, decision 0099): published where the profile caches prefixes, on a Unix socket under the data
dir (TOKENWISE_ENGINE_KV_EVENTS=ipc, the default) or on a TCP port of every interface ("tcp"). The gateway learns
where from the deployment's command (channels/routing.py)."""
import hashlib
import json
import os
import tempfile
from pathlib import Path

from django.conf import settings

FLAG = "--kv-events-config"
BUFFER_STEPS = 2000  # batches the engine keeps for a subscriber that missed some (one per engine step at most)
SOCKET_PATH_MAX = 100  # a Unix socket's path is at most 107 bytes


def socket_folder():
    """Where the engines' event sockets go: the data dir's run/ folder (only this user may enter it), or a folder
    of this user's under the system's temporary one when that path is too long for a socket."""
    folder = Path(settings.DATA_DIR) / "run"
    if len(str(folder)) + 32 > SOCKET_PATH_MAX:
        digest = hashlib.sha256(str(settings.DATA_DIR).encode()).hexdigest()[:12]
        folder = Path(tempfile.gettempdir()) / f"tokenwise-{os.getuid()}-{digest}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def publisher_args(deployment, *, free_port, engine_flags=None):
    """The flag that makes the deployment's engine publish its KV-cache events, or none (prefix caching off,
    TOKENWISE_ENGINE_KV_EVENTS=off, or a vLLM that the host's engine check found without the flag)."""
    if settings.ENGINE_KV_EVENTS == "off" or not deployment.profile.enable_prefix_caching:
        return []
    if engine_flags is not None and FLAG not in engine_flags:
        return []
    if settings.ENGINE_KV_EVENTS == "tcp":
        endpoint, replay = f"tcp://*:{free_port()}", f"tcp://*:{free_port()}"
    else:
        folder = socket_folder()
        endpoint, replay = f"ipc://{folder}/kv-{deployment.pk}.sock", f"ipc://{folder}/kv-{deployment.pk}-replay.sock"
    config = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint,
                         "replay_endpoint": replay, "buffer_steps": BUFFER_STEPS}, separators=(",", ":"))
    return [f"{FLAG}={config}"]  # one word: a value that starts with "{" is refused as a word of its own
