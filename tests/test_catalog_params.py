"""Every catalog model loads, and kvplan's parameter count matches the published total.

tests/data/catalog_params.yaml holds, for each models/<org>/<name>/config.json, the published total parameter
count with its source and quote (see the field notes at the top of that file). kvplan counts the weight
matrices from the config (kvplan/model/weights.py); this test holds that count to 3% of the published one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvplan.model.resolve import catalog_ids, load_spec
from kvplan.model.weights import estimate_weights

DATA = Path(__file__).resolve().parent / "data" / "catalog_params.yaml"
PUBLISHED: dict[str, dict] = yaml.safe_load(DATA.read_text(encoding="utf-8"))["models"]
IDS = catalog_ids()
TOLERANCE = 0.03
KINDS = {"model_card", "paper", "hub_model_size"}
SCOPES = {"checkpoint", "language_model", "checkpoint_including_vision"}


def test_every_catalog_model_has_a_published_count_and_no_extra():
    assert len(IDS) >= 125
    assert sorted(set(IDS) - set(PUBLISHED)) == [], "catalog models without a published count"
    assert sorted(set(PUBLISHED) - set(IDS)) == [], "published counts for models not in the catalog"


@pytest.mark.parametrize("hub_id", sorted(PUBLISHED))
def test_published_entry_is_complete(hub_id):
    entry = PUBLISHED[hub_id]
    assert isinstance(entry["params"], (int, float)) and entry["params"] > 1e6
    assert entry["kind"] in KINDS
    assert entry["source"].startswith("https://")
    assert isinstance(entry["quote"], str) and len(entry["quote"]) >= 5
    assert entry.get("scope", "checkpoint") in SCOPES
    if entry.get("scope") == "checkpoint_including_vision":
        assert entry.get("note"), f"{hub_id}: say why a total with a vision tower is compared"
    if "rounding" in entry:
        assert entry.get("note") and entry["rounding"] > 0


@pytest.mark.parametrize("hub_id", IDS)
def test_catalog_model_loads_and_is_sized(hub_id):
    spec = load_spec(hub_id)
    weights = estimate_weights(spec)
    assert spec.layers and weights.params > 0 and weights.bytes > 0
    assert 0 < weights.active_params <= weights.params


@pytest.mark.parametrize("hub_id", IDS)
def test_parameter_count_matches_published(hub_id):
    entry = PUBLISHED[hub_id]
    spec = load_spec(hub_id)
    counted = estimate_weights(spec).params
    if entry.get("lm_head_counted_separately") and spec.tie_embeddings:
        counted += spec.vocab_size * spec.hidden_size
    published = float(entry["params"])
    allowed = max(TOLERANCE, entry.get("rounding", 0) / 2 / published)
    error = counted / published - 1
    assert abs(error) <= allowed, (
        f"{hub_id}: kvplan counts {counted / 1e9:.3f}B, published {published / 1e9:.3f}B "
        f"({error:+.1%}, allowed {allowed:.1%}; {entry['source']})"
    )
