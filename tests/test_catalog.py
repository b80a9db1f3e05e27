"""Catalogs: every number has a source, every entry validates into its typed spec."""

from __future__ import annotations

import pytest

from devices.spec import DeviceSpec, LinkSpec
from twin.catalogs import catalog
from twin.kernel.catalog import unwrap_sources
from twin.kernel.errors import ScenarioError
from workloads.spec import ModelSpec

SPECS = {"devices": DeviceSpec, "links": LinkSpec, "models": ModelSpec}


@pytest.mark.parametrize("kind", ["devices", "links", "models", "hbm"])
def test_every_number_is_sourced(kind):
    cat = catalog(kind)  # loading raises CatalogError on an unsourced number
    assert len(cat.names()) >= 3
    for entry in cat:
        assert entry.sources, f"{entry.name} has no sourced values"
        assert all(s.strip() for s in entry.sources.values())


@pytest.mark.parametrize("kind", list(SPECS))
def test_entries_validate(kind):
    for entry in catalog(kind):
        spec = SPECS[kind].model_validate(entry.values)
        assert spec.name == entry.name


def test_required_entries_present():
    assert {"a100-sxm-80gb", "h100-sxm", "b200-sxm", "tpu-v5e", "tpu-v5p"} <= set(
        catalog("devices").names())
    assert {"nvlink3", "nvlink4", "nvlink5", "ib-hdr200", "ib-ndr400", "ici-v5e",
            "ici-v5p"} <= set(catalog("links").names())
    assert {"gpt3-175b", "llama3.2-1b", "llama3-8b"} <= set(catalog("models").names())


def test_unsourced_number_is_rejected():
    _, _, problems = unwrap_sources({"tdp_w": 700, "ok": {"value": 1, "source": "x"}})
    assert [p.path for p in problems] == ["tdp_w"]
    _, _, problems = unwrap_sources({"peak": {"value": {"bf16": 1}, "source": " "}})
    assert problems and "empty source" in problems[0].message


def test_unknown_name_lists_allowed():
    with pytest.raises(ScenarioError) as exc:
        catalog("devices").get("h200-nope", "cluster.device")
    p = exc.value.problems[0]
    assert p.path == "cluster.device" and "h100-sxm" in p.allowed


def test_gpt3_parameter_count():
    """GPT-3 175B has 174.6e9 parameters with tied embeddings (Brown et al.: 175B)."""
    from workloads.transformer import TransformerCosts

    m = ModelSpec.model_validate(catalog("models").get("gpt3-175b").values)
    n = TransformerCosts(m, "bf16", 1, 2048).total_params()
    assert 174e9 < n < 176e9


def test_hbm_stream_mix_figures_follow_their_stated_derivations():
    """devices/catalog/hbm/streams/training.yaml: every figure sourced, and the derived ones
    equal their derivation: bulk-copy row locality 1 - burst/row of every HBM part (to the
    stated rounding), GEMM read share mk + kn of mk + kn + mn for a square tile, DMA read share
    = 1 / (HBM bytes per link byte)."""
    from devices.hbm import load_hbm_spec
    from devices.memory_spec import STREAMS_DIR, MemorySpec, stream_mix
    from twin.kernel.catalog import load_entry

    path = STREAMS_DIR / "training.yaml"
    entry = load_entry(path)
    mix = stream_mix()
    assert set(mix) == {k for k in entry.sources}
    for name in ("hbm2e", "hbm3", "hbm3e"):
        hbm = load_hbm_spec(name)
        assert abs(mix["dma_row_locality"] - (1 - hbm.burst_bytes / hbm.row_bytes)) < 0.005
    n = 64
    assert mix["op_read_fraction"] == pytest.approx(2 * n * n / (3 * n * n), rel=1e-15)
    assert mix["dma_read_fraction"] == pytest.approx(1 / mix["dma_hbm_bytes_per_link_byte"])
    m = MemorySpec()
    assert (m.op.read_fraction, m.op.row_locality, m.dma.read_fraction, m.dma.row_locality,
            m.dma.hbm_bytes_per_link_byte) == (
        mix["op_read_fraction"], mix["op_row_locality"], mix["dma_read_fraction"],
        mix["dma_row_locality"], mix["dma_hbm_bytes_per_link_byte"])


def test_a_catalog_entry_with_overrides_keeps_the_sources_of_the_values_it_keeps():
    """``base: NAME`` plus keys: the overridden values are the scenario's, so their catalog
    sources are dropped; every value taken from the entry keeps its source."""
    from twin.catalogs import resolve

    entry = catalog("devices").get("h100-sxm")
    keys = sorted(entry.sources)
    changed = keys[0].split(".")[0]
    merged, sources = resolve("devices", {"base": "h100-sxm", changed: 1.0}, "cluster.device")
    assert merged[changed] == 1.0
    kept = {f"cluster.device.{k}" for k in keys if k.split(".")[0] != changed}
    assert set(sources) == kept and kept
    assert all(sources[f"cluster.device.{k}"] == entry.sources[k]
               for k in keys if k.split(".")[0] != changed)
