"""Resolve a model argument to a config.json: local path, bundled catalog, HF cache, then the hub.

huggingface_hub is imported only when the first two sources miss, so `kvplan size` on a catalog
model starts fast.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kvplan.errors import ModelNotFoundError
from kvplan.fileio import expand
from kvplan.model.config import ModelSpec, load_config, read_model

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def catalog_dir() -> Path:
    """The bundled catalog: inside the installed wheel, else the source tree's models/."""
    here = Path(__file__).resolve().parent.parent
    shipped = here / "_catalog"
    return shipped if shipped.is_dir() else here.parent / "models"


def catalog_ids() -> list[str]:
    root = catalog_dir()
    return sorted(str(p.parent.relative_to(root)).replace(os.sep, "/") for p in root.glob("*/*/config.json"))


@dataclass(frozen=True, slots=True)
class Resolved:
    name: str
    path: Path
    origin: str  # "path" | "catalog" | "hf-cache" | "hub"


def resolve(arg: str) -> Resolved:
    """Find the config.json for `arg`, trying each source in order."""
    if not arg or not arg.strip():
        raise ModelNotFoundError("expected a model id or a path to a config.json", field="model")
    local = expand(arg, ModelNotFoundError, "model")
    try:
        is_file, is_dir = local.is_file(), local.is_dir()
    except (OSError, ValueError):  # a name too long or otherwise impossible is not a local path
        is_file = is_dir = False
    if is_file:
        return Resolved(local.parent.name if local.name == "config.json" else local.stem, local, "path")
    if is_dir:
        if (local / "config.json").is_file():
            return Resolved(local.resolve().name, local / "config.json", "path")
        raise ModelNotFoundError("directory has no config.json", file=local, field="model")
    found = _from_catalog(arg)
    if found is not None:
        return found
    if not REPO_ID.match(arg) or ".." in arg:
        raise ModelNotFoundError(
            f"{arg!r} is neither a file, a directory, nor a model id like org/name{_suggest(arg)}",
            field="model",
        )
    return _from_hub(arg)


def load_spec(arg: str) -> ModelSpec:
    """Resolve `arg` and read its config into a ModelSpec."""
    found = resolve(arg)
    return read_model(load_config(found.path), found.name, str(found.path))


def _from_catalog(arg: str) -> Resolved | None:
    ids = catalog_ids()
    by_lower = {i.lower(): i for i in ids}
    match = by_lower.get(arg.lower())
    if match is None and "/" not in arg:
        names = [i for i in ids if i.split("/")[1].lower() == arg.lower()]
        match = names[0] if len(names) == 1 else None
    if match is None:
        return None
    return Resolved(match, catalog_dir() / match / "config.json", "catalog")


def _hf_cache_dir() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return os.path.join(home, "hub")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _from_hub(repo_id: str) -> Resolved:
    import huggingface_hub

    cache_dir = _hf_cache_dir()
    cached = huggingface_hub.try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    if isinstance(cached, str):
        return Resolved(repo_id, Path(cached), "hf-cache")
    if _offline():
        raise ModelNotFoundError(
            f"{repo_id!r} is not in the catalog or the HF cache, and HF_HUB_OFFLINE is set{_suggest(repo_id)}",
            field="model",
        )
    if not _hub_reachable(huggingface_hub.constants.ENDPOINT):
        raise ModelNotFoundError(
            f"{repo_id!r} is not in the catalog or the HF cache, and the hub cannot be reached{_suggest(repo_id)}",
            field="model",
        )
    huggingface_hub.logging.set_verbosity_error()
    try:
        path = huggingface_hub.hf_hub_download(
            repo_id, "config.json", cache_dir=cache_dir, token=os.environ.get("HF_TOKEN") or None
        )
    except Exception as exc:  # the hub's errors are many; all mean "could not get it"
        reason = exc.__class__.__name__
        raise ModelNotFoundError(
            f"{repo_id!r} not found offline and the hub could not be reached ({reason}){_suggest(repo_id)}",
            field="model",
        ) from None
    return Resolved(repo_id, Path(path), "hub")


def _hub_reachable(endpoint: str) -> bool:
    """A quick name lookup first, so that an offline machine fails at once instead of retrying."""
    import socket
    from urllib.parse import urlparse

    host = urlparse(endpoint).hostname or ""
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def _suggest(arg: str) -> str:
    ids = catalog_ids()
    lowered = {i.lower(): i for i in ids}
    names = {i.split("/")[1].lower(): i for i in ids}
    key = arg.lower()
    close = difflib.get_close_matches(key, list(lowered), n=3, cutoff=0.5)
    close += difflib.get_close_matches(key.split("/")[-1], list(names), n=3, cutoff=0.5)
    picks = list(dict.fromkeys([lowered.get(c) or names[c] for c in close]))[:3]
    return f"; closest catalog names: {', '.join(picks)}" if picks else "; see `kvplan models`"
