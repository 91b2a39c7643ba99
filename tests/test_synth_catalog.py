"""The seed-operator crawl: enough seeds, each a runnable KernelBench module with provenance."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from _synth_helpers import load_module, torch_catalog
from cuda_agent.synth.catalog import CrawlReport, behaviour_fingerprint, probe_all_ranks, read_catalog, write_catalog
from cuda_agent.tasks import validate_reference_source


def test_crawl_finds_at_least_150_seed_operators_with_plain_torch():
    seeds, report = torch_catalog()
    names = [s.name for s in seeds]
    assert len(names) >= 150, report.model_dump()
    assert len(set(names)) == len(names)
    sources = {s.provenance["source"] for s in seeds}
    assert {"torch.nn", "torch.nn.functional", "torch"} <= sources
    for s in seeds:
        assert s.provenance["qualname"] and s.provenance["torch"] == torch.__version__
        assert s.ranks and 1 <= s.arity <= 3
    # the usual suspects are found; random ops are probed and dropped, with the reason counted
    merged = {m.strip() for s in seeds for m in s.provenance.get("same_as", "").split(",") if m.strip()}
    for expected in ("nn.Conv2d", "nn.Linear", "nn.LayerNorm", "F.gelu", "torch.tanh", "F.scaled_dot_product_attention"):
        assert expected in names or expected in merged, expected
    assert not [n for n in names if "Dropout" in n or "dropout" in n or "rrelu" in n.lower()]
    assert report.skipped.get("probe: random", 0) >= 3
    assert report.kept == len(seeds) and report.tried > report.kept


def test_seeds_identical_in_behaviour_are_merged_with_their_provenance():
    seeds, report = torch_catalog()
    by_name = {s.name: s for s in seeds}
    assert report.merged >= 20
    # aliases are one seed that names the others; ReLU and ReLU6 differ (above 6) and stay apart
    abs_seed = by_name["torch.abs"]
    assert "torch.absolute" in abs_seed.provenance["same_as"] and "torch.absolute" not in by_name
    assert abs_seed.provenance["same_as_qualnames"]
    assert "nn.ReLU" in by_name and "nn.ReLU6" in by_name
    relu = by_name["nn.ReLU"].provenance.get("same_as", "")
    assert "F.relu" in relu and "relu6" not in relu
    assert len({behaviour_fingerprint(s) for s in seeds[::7]}) == len(seeds[::7])


def test_every_seed_class_source_is_a_runnable_task():
    seeds, _ = torch_catalog()
    for seed in seeds[::5]:
        validate_reference_source(seed.class_source, seed.name)
        m = load_module(seed.class_source)
        torch.manual_seed(0)
        model = m.Model(*m.get_init_inputs())
        out = model(*m.get_inputs())
        out = out[0] if isinstance(out, (tuple, list)) else out
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32, seed.name
        assert bool(torch.isfinite(out).all()), seed.name


def test_catalog_file_round_trips(tmp_path):
    seeds, _ = torch_catalog()
    path = tmp_path / "catalog.jsonl"
    write_catalog(path, list(seeds))
    assert read_catalog(path) == list(seeds)


def test_a_random_module_is_rejected_by_the_probe():
    from cuda_agent.synth.catalog import ArgSpec, SeedOp, _Reject

    spec = SeedOp(name="nn.Dropout", kind="module", target="nn.Dropout", args=(ArgSpec(name="p", value=0.5),))
    with pytest.raises(_Reject, match="random"):
        probe_all_ranks(spec, (2,))


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_transformers_blocks_are_inlined_and_run_without_transformers():
    from cuda_agent.synth.hf import transformers_specs

    report = CrawlReport()
    seeds = []
    for spec in transformers_specs(report):
        try:
            seeds.append(probe_all_ranks(spec, (2, 3)))
        except Exception:  # noqa: BLE001 - the probe decides which blocks are usable
            continue
    names = [s.name for s in seeds]
    assert len(seeds) >= 10, names
    assert any(n.endswith("RMSNorm") for n in names)
    assert any(n.endswith(".rotary") for n in names)
    assert any(n.endswith("MLP") for n in names)
    for seed in seeds:
        assert "transformers" not in seed.class_source.split("class Model")[0].replace("cuda-agent", "")  # no import
        m = load_module(seed.class_source)
        assert isinstance(m.Model()(*m.get_inputs()), torch.Tensor)
