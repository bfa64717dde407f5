"""Resolve a model argument to a config.json: local path, bundled catalog, HF cache, then the hub.

huggingface_hub is imported only when the first two sources miss, so `kvplan size` on a catalog
model starts fast.

Between the HF cache and the hub, the usual variants of a catalog model resolve offline to it
(`catalog_alias`): the hub's renames (meta-llama/Llama-3.1-70B is the catalog's
Meta-Llama-3.1-70B; CohereLabs was CohereForAI), base / Instruct / chat / -it / -hf variants,
which share one architecture, re-uploads under another org, and quantized re-uploads named by
the usual suffixes (-FP8, -FP8-Dynamic, -AWQ, -GPTQ-Int4, -GPTQ-Int8, -bnb-4bit), which get the
quantization_config those uploads carry by convention (fp8 dynamic; AWQ and GPTQ 4-bit with
groups of 128). Each such resolution says so in a note: for exactness give the checkpoint's own
config.json.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from kvplan.errors import ModelNotFoundError
from kvplan.fileio import expand
from kvplan.model.config import load_config, read_model
from kvplan.model.spec import ModelSpec

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# Longer than any path the OS takes (PATH_MAX is 4096 on Linux) and any hub id (96 + 1 + 96): refused
# before a file is looked up or a suggestion is ranked, so that a pasted blob fails at once.
MAX_MODEL_ARG = 4096
SUGGEST_CHARS = 96  # the suggestion ranks a name by at most this many characters (a hub name's limit)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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
    origin: str  # "path" | "catalog" | "alias" | "hf-cache" | "hub"
    quantization: dict | None = None  # alias of a quantized re-upload: its conventional config
    note: str = ""


ORG_RENAMES = {"coherelabs": "cohereforai"}  # the hub's renamed orgs -> the catalog's spelling
VARIANT = re.compile(r"[-_.](instruct|chat|it|hf|base)$")
QUANT_SUFFIXES = {  # suffix -> (quantization_config as such re-uploads carry it, scheme in words)
    "fp8-dynamic": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),
    "fp8": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
            "AWQ 4-bit, groups of 128"),
    "gptq-int4": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
                  "GPTQ 4-bit, groups of 128"),
    "gptq-int8": ({"quant_method": "gptq", "bits": 8, "group_size": 128, "desc_act": False, "sym": True},
                  "GPTQ 8-bit, groups of 128"),
    "bnb-4bit": ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes 4-bit"),
}
SIZE = re.compile(r"(\d+(?:\.\d+)?)b\b")


def resolve(arg: str) -> Resolved:
    """Find the config.json for `arg`, trying each source in order."""
    if not arg or not arg.strip():
        raise ModelNotFoundError("expected a model id or a path to a config.json", field="model")
    if len(arg) > MAX_MODEL_ARG:
        raise ModelNotFoundError(f"expected a model id or a path of at most {MAX_MODEL_ARG:,} characters, "
                                 f"got {len(arg):,}", field="model")
    if "\x00" in arg:  # no path holds a NUL byte: refused as an id, not looked up as a file
        _refuse_control(arg)
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
    if CONTROL.search(arg):  # a folder may be named so; an id may not
        _refuse_control(arg)
    found = _from_catalog(arg)
    if found is not None:
        return found
    repo_like = bool(REPO_ID.match(arg)) and ".." not in arg
    if repo_like and _in_hf_cache(arg):
        return _from_hub(arg)
    alias = catalog_alias(arg)
    if alias is not None:
        return alias
    if not repo_like:
        raise ModelNotFoundError(
            f"{arg!r} is neither a file, a directory, nor a model id like org/name{_suggest(arg)}",
            field="model",
        )
    return _from_hub(arg)


def _refuse_control(arg: str):
    control = CONTROL.search(arg)
    raise ModelNotFoundError(f"expected a model id or a path; it holds the control character "
                             f"{control.group(0)!r} at character {control.start() + 1}", field="model")


def load_spec(arg: str) -> ModelSpec:
    """Resolve `arg` and read its config into a ModelSpec."""
    found = resolve(arg)
    raw = load_config(found.path)
    if found.quantization is not None:
        raw = {**raw, "quantization_config": found.quantization}
    spec = read_model(raw, found.name, str(found.path))
    if found.note:
        spec = replace(spec, dtype_note="; ".join(n for n in (found.note, spec.dtype_note) if n))
    return spec


def _key(name: str) -> tuple[str, tuple | None]:
    """A name reduced to its architecture: lower case, no leading "meta-", no variant or
    quantization suffix; and the quantization suffix it had (its QUANT_SUFFIXES entry)."""
    key, quant = name.lower(), None
    for suffix, entry in QUANT_SUFFIXES.items():
        if key.endswith("-" + suffix) or key.endswith("_" + suffix):
            key, quant = key[: -len(suffix) - 1], entry
            break
    while True:
        stripped = VARIANT.sub("", key)
        if stripped == key:
            break
        key = stripped
    return key.removeprefix("meta-"), quant


def catalog_alias(arg: str) -> Resolved | None:
    """The catalog model `arg` is a variant or re-upload of, or None (see the module docstring).

    The same org is preferred; another org's re-upload resolves only when the architecture is
    unique in the catalog; of several catalog variants the one of the same kind (Instruct or
    base) is taken, then the first by name."""
    org, _, name = arg.strip().rpartition("/")
    org = ORG_RENAMES.get(org.lower(), org.lower())
    key, quant = _key(name)
    candidates = [i for i in catalog_ids() if _key(i.split("/")[1])[0] == key]
    if not candidates:
        return None
    same_org = [i for i in candidates if i.split("/")[0].lower() == org]
    if same_org:
        candidates = same_org
    elif len({i.split("/")[0] for i in candidates}) > 1:
        return None
    wanted = VARIANT.search(name.lower().removesuffix("-" + next((s for s in QUANT_SUFFIXES
                                                                  if name.lower().endswith("-" + s)), "")))
    kind = wanted.group(1) if wanted else None
    same_kind = [i for i in candidates if (VARIANT.search(i.lower()) or [None, None])[1] == kind]
    match = sorted(same_kind or candidates)[0]
    quantization, scheme = quant if quant else (None, "")
    note = f"resolved offline as the catalog's {match} (same architecture)"
    if quant:
        note += f"; weights sized as {scheme}, as such re-uploads are; give the checkpoint's config.json for exactness"
    return Resolved(arg.strip(), catalog_dir() / match / "config.json", "alias", quantization, note)


def _in_hf_cache(repo_id: str) -> bool:
    """Whether the HF cache holds this repo (a folder check, no hub import)."""
    org, name = repo_id.split("/", 1)
    return (Path(_hf_cache_dir()) / f"models--{org}--{name}").is_dir()


def _from_catalog(arg: str) -> Resolved | None:
    if REPO_ID.match(arg) and ".." not in arg:  # the common case, without listing the catalog
        direct = catalog_dir() / arg / "config.json"
        if direct.is_file():
            return Resolved(arg, direct, "catalog")
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
    """Closest catalog names: the same family and size first, then the same family, then by
    spelling."""
    ids = catalog_ids()
    key, _ = _key(arg.split("/")[-1][:SUGGEST_CHARS])
    family = re.match(r"[a-z]+", key)
    size = SIZE.search(key)

    def rank(i: str) -> tuple:
        other, _ = _key(i.split("/")[1])
        same_family = bool(family) and other.startswith(family.group(0))
        same_size = bool(size) and bool(SIZE.search(other)) and SIZE.search(other).group(1) == size.group(1)
        return (not (same_family and same_size), not same_family,
                -difflib.SequenceMatcher(None, key, other).ratio(), i)

    picks = [i for i in sorted(ids, key=rank)[:3]
             if difflib.SequenceMatcher(None, key, _key(i.split("/")[1])[0]).ratio() >= 0.4]
    return f"; closest catalog names: {', '.join(picks)}" if picks else "; see `kvplan models`"
