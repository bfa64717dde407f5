"""GPU rental prices for `kvplan plan`: the shipped table (kvplan/model/prices.json, one cited row
per GPU with its date), a file of the same shape, and `--price GPU=USD` overrides.

A price file is `{"prices": [{"gpu": "H100-80GB", "usd_per_gpu_hour": 2.49, ...}, ...]}`; GPU names
are resolved through the catalog, so `H100` or `h100-80gb` name the same part.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvplan.errors import UsageError

SHIPPED = Path(__file__).resolve().parents[1] / "model" / "prices.json"
MAX_PRICE = 1e4  # $/GPU-hour: above this a number is a typo, not a price


def _price(value, where: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= MAX_PRICE:
        raise UsageError(f"{where}: expected a price in $/GPU-hour above 0 and at most {MAX_PRICE:g}, "
                         f"got {value!r}", field=field)
    return float(value)


def _gpu(name: str, where: str, field: str) -> str:
    from kvplan.errors import KvplanError
    from kvplan.model.gpus import get_gpu

    try:
        return get_gpu(name).name
    except KvplanError as exc:
        raise UsageError(f"{where}: {exc.message}", field=field) from None


def read_price_file(path: Path) -> tuple[dict[str, float], dict[str, dict]]:
    """(GPU -> $/GPU-hour, GPU -> its row) from a price file; one-line errors naming the file."""
    from kvplan.fileio import decode, read_limited

    where = str(path)
    text = decode(read_limited(path, 4 * 2**20, UsageError, "--prices", what="price file"), Path(path), UsageError,
                  "--prices")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON ({exc.msg} at line {exc.lineno})", field="--prices") from None
    rows = doc.get("prices") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise UsageError(f"{where}: expected an object with a \"prices\" list", field="--prices")
    prices, meta = {}, {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("gpu"), str):
            raise UsageError(f"{where}: prices[{i}] needs a \"gpu\" name", field="--prices")
        gpu = _gpu(row["gpu"], where, "--prices")
        prices[gpu] = _price(row.get("usd_per_gpu_hour"), f"{where}: prices[{i}].usd_per_gpu_hour", "--prices")
        meta[gpu] = row
    return prices, meta


def load_prices(path: Path | None = None, overrides: list[str] | None = None) -> tuple[dict[str, float], dict]:
    """The shipped table, or `path` instead; then `GPU=USD` overrides on top."""
    prices, meta = read_price_file(path if path is not None else SHIPPED)
    for item in overrides or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"expected GPU=USD per GPU-hour, e.g. H100-80GB=2.49, got {item!r}", field="--price")
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"expected a number of dollars after '=', got {value!r}", field="--price") from None
        gpu = _gpu(name.strip(), item, "--price")
        prices[gpu] = _price(number, item, "--price")
        meta[gpu] = {"gpu": gpu, "usd_per_gpu_hour": number, "source": "--price"}
    return prices, meta
