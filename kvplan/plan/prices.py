"""GPU rental prices for `kvplan plan`: what renting a deployment costs, by the offers that rent it.

An offer is one cited price row: a GPU, its $/GPU-hour, a tier and the instance shapes it rents
(kvplan/plan/prices.json, or a file of the same shape, or `--price GPU=USD`):

    {"prices": [{"gpu": "H100-80GB", "usd_per_gpu_hour": 3.99, "tier": "on-demand",
                 "instance_gpus": [8], "provider": "...", "date": "2026-11-09", "source": "https://..."}]}

- `tier`: "marketplace" (third-party hosts without a data-centre SLA), "on-demand" (a cloud's
  pay-as-you-go data-centre instances) or "reserved" (a committed term); a row without one is
  on-demand. `--price-tier` picks the tiers searched (on-demand by default: the price anyone can
  rent at with an SLA and no commitment).
- `instance_gpus`: the GPU counts of the instances the price is for ([8]: whole 8-GPU nodes only).
  A replica stays inside one instance, so R replicas of TP t on instances of s GPUs rent
  ceil(R / floor(s / t)) instances of s GPUs, all paid for; the cheapest shape and offer wins. A row
  without `instance_gpus`, and every `--price` override, rents exactly the GPUs used.

GPU names are resolved through the catalog, so `H100` or `h100-80gb` name the same part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from kvplan.errors import UsageError

SHIPPED = Path(__file__).resolve().with_name("prices.json")  # shipped in the wheel
MAX_PRICE = 1e4  # $/GPU-hour: above this a number is a typo, not a price
TIERS = ("marketplace", "on-demand", "reserved")
DEFAULT_TIERS = ("on-demand",)
OVERRIDE = "override"  # the tier of a --price GPU=USD, searched whatever --price-tier says
MAX_INSTANCE_GPUS = 64
MAX_ROWS = 10_000


@dataclass(frozen=True, slots=True)
class Offer:
    gpu: str
    usd_per_gpu_hour: float
    tier: str
    instance_gpus: tuple[int, ...] | None  # None: exactly the GPUs used
    row: dict  # the row as given (provider, date, source, note)


@dataclass(frozen=True, slots=True)
class Rental:
    """What a deployment rents: the offer, its instances and what they cost."""

    offer: Offer
    instances: int
    instance_gpus: int  # GPUs per instance (the GPUs used, for an offer of any shape)
    usd_per_hour: float

    @property
    def gpus_rented(self) -> int:
        return self.instances * self.instance_gpus

    def to_dict(self) -> dict:
        row = self.offer.row
        return {"tier": self.offer.tier, "usd_per_gpu_hour": self.offer.usd_per_gpu_hour,
                "instances": self.instances, "instance_gpus": self.instance_gpus, "gpus_rented": self.gpus_rented,
                "provider": row.get("provider"), "date": row.get("date"), "source": row.get("source")}


def rental_cost(offer: Offer, tp: int, replicas: int) -> Rental | None:
    """The cheapest way `offer` rents `replicas` replicas of `tp` GPUs (None: no shape holds one)."""
    if replicas <= 0:
        return None
    if offer.instance_gpus is None:
        return Rental(offer, replicas, tp, replicas * tp * offer.usd_per_gpu_hour)
    best = None
    for size in offer.instance_gpus:
        if size < tp:
            continue
        instances = math.ceil(replicas / (size // tp))
        cost = instances * size * offer.usd_per_gpu_hour
        if best is None or (cost, size) < (best.usd_per_hour, best.instance_gpus):
            best = Rental(offer, instances, size, cost)
    return best


@dataclass(frozen=True, slots=True)
class PriceBook:
    """The offers searched: those of the tiers asked for, and every override."""

    offers: tuple[Offer, ...]
    tiers: tuple[str, ...] = DEFAULT_TIERS

    def gpus(self) -> list[str]:
        return sorted({o.gpu for o in self.offers})

    def rent(self, gpu: str, tp: int, replicas: int) -> Rental | None:
        """The cheapest rental of `replicas` x TP `tp` on `gpu` (ties: the earlier row)."""
        best = None
        for offer in self.offers:
            if offer.gpu != gpu:
                continue
            r = rental_cost(offer, tp, replicas)
            if r is not None and (best is None or r.usd_per_hour < best.usd_per_hour):
                best = r
        return best

    def no_rental_reason(self, gpu: str, tp: int) -> str:
        shapes = sorted({s for o in self.offers if o.gpu == gpu for s in (o.instance_gpus or ())})
        if not any(o.gpu == gpu for o in self.offers):
            return f"no {'/'.join(self.tiers)} price for {gpu}"
        return (f"no {'/'.join(self.tiers)} offer rents {tp} {gpu} in one instance "
                f"(instances of {', '.join(map(str, shapes))} GPUs)")

    def rows(self, gpus) -> dict[str, list[dict]]:
        """Each GPU's offers as rows (for the report's assumptions)."""
        out: dict[str, list[dict]] = {}
        for o in self.offers:
            if o.gpu in gpus:
                out.setdefault(o.gpu, []).append({**o.row, "tier": o.tier, "usd_per_gpu_hour": o.usd_per_gpu_hour})
        return out


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


def _shapes(value, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_INSTANCE_GPUS for v in value):
        raise UsageError(f"{where}: expected a list of GPU counts per instance from 1 to {MAX_INSTANCE_GPUS}, "
                         f"e.g. [8], got {value!r}", field="--prices")
    return tuple(sorted(set(value)))


def read_price_file(path: Path) -> list[Offer]:
    """The offers of a price file; one-line errors naming the file and the row."""
    from kvplan.fileio import load_json, read_limited

    where = str(path)
    doc = load_json(read_limited(path, 4 * 2**20, UsageError, "--prices", what="price file"), Path(path), UsageError,
                    "--prices")
    rows = doc.get("prices") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise UsageError(f"{where}: expected an object with a \"prices\" list", field="--prices")
    if not rows:
        raise UsageError(f"{where}: the \"prices\" list is empty; expected at least one row", field="--prices")
    if len(rows) > MAX_ROWS:
        raise UsageError(f"{where}: expected at most {MAX_ROWS:,} price rows, got {len(rows):,}", field="--prices")
    offers = []
    for i, row in enumerate(rows):
        at = f"{where}: prices[{i}]"
        if not isinstance(row, dict) or not isinstance(row.get("gpu"), str):
            raise UsageError(f"{at} needs a \"gpu\" name", field="--prices")
        tier = row.get("tier", "on-demand")
        if tier not in TIERS:
            raise UsageError(f"{at}.tier: expected one of {', '.join(TIERS)}, got {tier!r}", field="--prices")
        source = row.get("source")
        if source is not None and not (isinstance(source, str) and source.startswith(("https://", "http://"))):
            raise UsageError(f"{at}.source: expected an http(s) URL, got {str(source)[:80]!r}", field="--prices")
        offers.append(Offer(_gpu(row["gpu"], where, "--prices"),
                            _price(row.get("usd_per_gpu_hour"), f"{at}.usd_per_gpu_hour", "--prices"), tier,
                            _shapes(row.get("instance_gpus"), f"{at}.instance_gpus"), dict(row)))
    return offers


def parse_tiers(text: str | None) -> tuple[str, ...]:
    """`--price-tier`: some of marketplace, on-demand, reserved (or `any`)."""
    if text is None:
        return DEFAULT_TIERS
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    if words == ["any"]:
        return TIERS
    for w in words:
        if w not in TIERS:
            raise UsageError(f"expected some of {', '.join(TIERS)} (or any), got {w!r}", field="--price-tier")
    if not words:
        raise UsageError("expected at least one tier: marketplace, on-demand, reserved or any", field="--price-tier")
    return tuple(t for t in TIERS if t in words)


def load_prices(path: Path | None = None, overrides: list[str] | None = None,
                tiers: tuple[str, ...] = DEFAULT_TIERS) -> PriceBook:
    """The shipped table, or `path` instead, its offers of `tiers`; then `GPU=USD` overrides, which
    replace every offer of their GPU."""
    offers = [o for o in read_price_file(path if path is not None else SHIPPED) if o.tier in tiers]
    for item in overrides or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"expected GPU=USD per GPU-hour, e.g. H100-80GB=2.49, got {item!r}", field="--price")
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"expected a number of dollars after '=', got {value!r}", field="--price") from None
        gpu = _gpu(name.strip(), item, "--price")
        usd = _price(number, item, "--price")
        offers = [o for o in offers if o.gpu != gpu]
        offers.append(Offer(gpu, usd, OVERRIDE, None, {"gpu": gpu, "usd_per_gpu_hour": usd, "source": "--price"}))
    if not offers:
        where = path if path is not None else SHIPPED
        raise UsageError(f"{where}: no {'/'.join(tiers)} price; try --price-tier any or --price GPU=USD",
                         field="--price-tier")
    return PriceBook(tuple(offers), tiers)
