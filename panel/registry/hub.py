"""Find a hub id ("Qwen/Qwen2.5-7B-Instruct") in the local Hugging Face cache. Never downloads."""
import os
import re
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class NotInCache(Exception):
    """The hub id is not in the local cache; the message says where we looked and what to do."""


def hub_cache_dir():
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.environ["HUGGINGFACE_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return home / "hub"


def looks_like_hub_id(text):
    return bool(HUB_ID.match(text)) and not text.startswith((".", "/", "~"))


def resolve_hub_id(hub_id, *, revision="main"):
    """The snapshot folder of `hub_id` in the local cache, or NotInCache."""
    cache = hub_cache_dir()
    repo = cache / ("models--" + hub_id.replace("/", "--"))
    hint = ("this panel never downloads: fetch it on a machine with hub access (huggingface-cli download) and "
            "copy the folder here, then register its local path")
    if not repo.is_dir():
        raise NotInCache(f"{hub_id} is not in the local hub cache ({cache}); {hint}")
    ref = repo / "refs" / revision
    snapshots = repo / "snapshots"
    if ref.is_file():
        snapshot = snapshots / ref.read_text().strip()
    else:
        candidates = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
        snapshot = candidates[-1] if candidates else None
    if snapshot is None or not (snapshot / "config.json").exists():
        raise NotInCache(f"{hub_id} is only partly in the local hub cache ({repo}); {hint}")
    return snapshot
