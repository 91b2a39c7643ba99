"""The export criterion (criterion.py) and the composer's hazard probe (hazards.py), on the CPU.

The audit of round two found three defective exports of `cuda-agent synth --n 30 --device cpu
--seed 7`; their sources, composed from the same seeds by the composer of that round, are kept in
fixtures/synth_audit/ (tests/test_synth_pipeline.py recomposes them from the seeds and the full
catalog) and are checked here at their exported sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from _synth_helpers import load_module, torch_catalog
from cuda_agent.synth.compose import ComposeConfig, ProgrammaticComposer, set_batch
from cuda_agent.synth.criterion import CRITERION_FILTERS, Tolerance, check_task
from cuda_agent.synth.filters import FILTERS, FilterConfig
from cuda_agent.synth.hazards import seed_hazard

AUDIT = Path(__file__).resolve().parent / "fixtures" / "synth_audit"

# the audit's three tasks: BATCH as exported (448 from the audit; the other two as this machine's
# runtime window rescaled them) and the reason each must be rejected for
AUDITED = [("3_ceil_Hardshrink_addcmul_instance_norm", 448, "criterion_jitter"),
           ("5_avg_pool3d_ZeroPad1d_remainder", 732, "criterion_jitter"),
           ("54_reciprocal_addcdiv_LocalResponseNorm", 283, "criterion_nonfinite")]

HONEST = """
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(128, 64)

    def forward(self, x):
        return F.gelu(self.fc(x)) * torch.sigmoid(x[:, :64])


def get_inputs():
    return [torch.randn(BATCH, 128)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("name,batch,reason", AUDITED)
def test_the_audits_defective_tasks_fail_the_criterion_at_their_exported_size(name, batch, reason):
    source = set_batch((AUDIT / f"{name}.py").read_text(), batch)
    res = check_task(source, name=name)
    assert not res.ok and res.filter == reason, res
    assert res.message.startswith("input set ") and res.shapes and res.shapes[0][0] == batch
    if "remainder" in name:
        # a remainder by a random divisor flips on about one set in ten at this size: the 1e-4
        # screen fails at once and the task is tried on the suspect sets, where it fails
        assert res.screened and "sets were tried" in res.message, res


def test_an_honest_task_passes_every_set_with_a_float64_basis():
    res = check_task(HONEST, sets=30)
    assert res.ok and res.sets_passed == 30 and res.float64 and not res.screened, res


def test_float32_far_from_float64_is_rejected_as_such():
    # (x + 1e6) - 1e6 keeps 1/16 of a unit in float32: exact in float64, off by up to 0.03 in float32
    source = HONEST.replace("return F.gelu(self.fc(x)) * torch.sigmoid(x[:, :64])",
                            "return F.gelu(self.fc(x)) + ((x[:, :64] + 1e6) - 1e6)")
    res = check_task(source, sets=5)
    assert res.filter == "criterion_float64" and "float64" in res.message, res


def test_the_criterion_uses_the_judges_tolerance_and_names_its_rejections():
    assert Tolerance.from_judge() == Tolerance.from_filters(FilterConfig().payload())
    assert set(CRITERION_FILTERS) <= set(FILTERS)
    with pytest.raises(ValueError, match="sets"):
        check_task(HONEST, sets=0)


def _seed(name: str):
    return next(s for s in torch_catalog()[0] if s.name == name)


@pytest.mark.parametrize("name,guard", [
    ("torch.ceil", None), ("torch.floor", None), ("torch.remainder", None), ("torch.sign", None),
    ("torch.copysign", None), ("torch.histc", None),
    ("nn.Hardshrink", None), ("nn.Threshold", None),
    ("torch.reciprocal", "abs1"), ("torch.addcdiv", "abs1"), ("torch.tan", "sigmoid"),
    ("nn.Tanh", "none"), ("nn.GELU", "none"), ("nn.LocalResponseNorm", "none"), ("torch.log", "abs1")])
def test_the_probe_guards_poles_and_leaves_out_jumps(name, guard):
    seed = _seed(name)
    hz = seed_hazard(seed, seed.ranks[0])
    assert hz.guard == guard, hz
    if guard != "none" and seed.domain == "real":
        assert hz.reason    # what it did unguarded is said (log: undefined there, abs() + 1 from the catalog)


def test_composed_tasks_never_run_a_refused_seed_and_guard_what_needs_it():
    composer = ProgrammaticComposer(list(torch_catalog()[0]), ComposeConfig(profile="cpu", max_ops=3))
    for k in range(60):
        comp = composer.compose(7_000 + k)
        for op in comp.ops:
            assert not op.startswith(("torch.ceil", "torch.floor", "torch.remainder", "nn.Hardshrink")), comp.source
        if "torch.reciprocal(" in comp.source:
            assert ".abs() + 1.0" in comp.source
        load_module(comp.source)   # renders a module that loads
    assert composer.refused(), "the probe refused no seed at all"
    assert all(":" in why for why in composer.refused().values())


def test_without_hazard_guards_the_composer_is_the_previous_one():
    seeds = list(torch_catalog()[0])
    old = ProgrammaticComposer(seeds, ComposeConfig(profile="cpu", hazard_guards=False))
    assert not old.refused()
    for k in range(20):
        comp = old.compose(100 + k)
        guards = [ln.strip() for ln in comp.source.splitlines() if ln.strip().startswith("p") and " = " in ln]
        # the one guard of the previous composer: abs() + 1 for seeds undefined on real inputs
        assert all(g.endswith(".abs() + 1.0") for g in guards), comp.source


@pytest.mark.gpu
def test_on_the_gpu_the_audits_tasks_fail_and_an_honest_one_passes():
    """The same on CUDA, where the judge draws inputs on the device (true fp32: no TF32)."""
    import torch

    from cuda_agent.host import true_fp32

    true_fp32(torch)
    assert check_task(HONEST, device="cuda").ok
    # the two jumps (54 fails on an input of exactly 0, as the CPU's generator draws it on set 13;
    # the device's generator may never draw one in 30 sets)
    for name, batch, reason in AUDITED[:2]:
        res = check_task(set_batch((AUDIT / f"{name}.py").read_text(), batch), device="cuda", name=name)
        assert res.filter == reason, (name, res)
