"""The relative L2 bound scaled to the reference's own numerical noise, judged for real (CPU backend):
the reference also runs in float64 on the checked calls, the candidate may be a multiple of the fp32
reference's own error away from that, and the fixed per-dtype bound is the floor (and the whole
bound where float64 is impossible)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import judge_cache_dir
from cuda_agent.candidate import Candidate
from cuda_agent.judge import Judge, JudgeConfig
from cuda_agent.judge.verdict import FailureCategory
from cuda_agent.tasks import Task, load_task_file
from cuda_agent.reward import reward_of

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return judge_cache_dir(tmp_path_factory)


def _config(cache_dir, device: str = "cpu", **kw) -> JudgeConfig:
    return JudgeConfig(device=device, compile_mode="none", n_timed=3, n_warmup=1, cache_dir=cache_dir, **kw)


def _deep_chain_reordering(cache_dir, device: str) -> None:
    """The honest blocked-summation candidate of the deep chain: refused by the fixed bound, accepted
    by the noise-scaled one, with the verdict showing both errors and the bound used."""
    tasks = FIXTURES / "tasks" / ("cuda" if device == "cuda" else "")
    task = load_task_file(tasks / "deep_tanh_chain.py")
    cand = Candidate.from_path(FIXTURES / device / "honest" / "deep_chain_blocked.py")
    with Judge(_config(cache_dir, device, ref_noise_multiple=0.0)) as j:
        fixed = j.evaluate(task, cand)
    assert not fixed.correct and fixed.failure is not None, fixed.summary()
    assert fixed.failure.category == FailureCategory.MISMATCH, fixed.failure
    assert "fixed bound for float32" in fixed.failure.message, fixed.failure.message
    assert fixed.max_rel_l2_err > 1e-4 and fixed.max_rel_l2_err_f64 is None

    with Judge(_config(cache_dir, device)) as j:
        v = j.evaluate(task, cand)
    assert v.correct and v.failure is None and reward_of(v).value >= 1, v.summary()
    # the candidate is further from the fp32 reference than the fixed bound allows ...
    assert v.max_rel_l2_err > 1e-4
    # ... because the reference itself is that far from float64 (depth, not hardware, makes the
    # noise); the bound follows it
    assert v.ref_noise_rel_l2 > 1e-5
    assert v.rel_l2_bound == pytest.approx(16 * min(c.ref_noise_rel_l2 for c in v.calls if c.role == "check"))
    assert v.max_rel_l2_err_f64 <= v.rel_l2_bound
    checks = [c for c in v.calls if c.role == "check"]
    later = [c for c in v.calls if c.role != "check"]
    assert len(checks) == 5 and all(c.rel_l2_err_f64 is not None and c.ref_noise_rel_l2 is not None
                                    and c.rel_l2_err_f64 <= c.rel_l2_bound for c in checks)
    # calls without float64 keep the widest checked bound plus the reference's noise, against the reference
    carried = max(c.rel_l2_bound + c.ref_noise_rel_l2 for c in checks)
    assert later and all(c.rel_l2_err_f64 is None and c.rel_l2_bound == pytest.approx(carried)
                         and c.rel_l2_err <= c.rel_l2_bound for c in later)
    s = v.summary()
    assert s["rel_l2_bound"] == v.rel_l2_bound and s["ref_noise_rel_l2"] == v.ref_noise_rel_l2
    assert s["max_rel_l2_err_f64"] == v.max_rel_l2_err_f64


@pytest.mark.slow
def test_fp32_reordering_of_a_deep_chain_fails_a_fixed_bound_and_passes_the_noise_scaled_one(cache_dir):
    _deep_chain_reordering(cache_dir, "cpu")


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_fp32_reordering_of_a_deep_chain_fails_a_fixed_bound_and_passes_the_noise_scaled_one(cache_dir):
    _deep_chain_reordering(cache_dir, "cuda")


HEAD = "import torch\nimport torch.nn as nn\n\n"
TAIL = ("\n\ndef get_inputs():\n    return [torch.randn(8, 256)]\n\n\n"
        "def get_init_inputs():\n    return []\n")


def _task(forward: str, init: str = "pass") -> Task:
    source = (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              f"        {init}\n\n    def forward(self, x):\n"
              + "".join(f"        {line}\n" for line in forward.splitlines()) + TAIL)
    return Task.from_source(source, name="tolerance")


def test_a_reference_that_breaks_in_float64_keeps_the_fixed_bound(cache_dir):
    # a float32 constant made inside forward: the double copy of the model cannot multiply by it
    task = _task("return torch.tanh(x @ torch.ones(256, 256, dtype=torch.float32) * 0.01)")
    with Judge(_config(cache_dir)) as j:
        v = j.check_reference(task)
    assert v.correct, v.failure
    assert any(n.startswith("no float64 reference (RuntimeError") for n in v.notes), v.notes
    assert v.rel_l2_bound == 1e-4 and v.ref_noise_rel_l2 is None and v.max_rel_l2_err_f64 is None
    assert all(c.rel_l2_bound == 1e-4 for c in v.calls)


def test_a_well_conditioned_reference_keeps_the_floor_and_reports_its_noise(cache_dir):
    with Judge(_config(cache_dir)) as j:
        v = j.check_reference(_task("return torch.tanh(self.fc(x))", init="self.fc = nn.Linear(256, 256)"))
    assert v.correct, v.failure
    assert v.ref_noise_rel_l2 is not None and 0 < v.ref_noise_rel_l2 < 1e-6
    assert v.rel_l2_bound == 1e-4 and v.max_rel_l2_err_f64 <= v.ref_noise_rel_l2 * 1.0001
    assert not any("float64" in n for n in v.notes)


def test_a_reference_noisier_than_the_ceiling_passes_itself_and_is_flagged_as_a_task(cache_dir):
    # the deep chain's reference is ~2e-4 from float64; with the ceiling below that, the bound is the
    # ceiling plus 6x that error: the reference still reproduces itself (a faithful copy of it must pass),
    # and the task is flagged as ill-conditioned for task sets
    task = load_task_file(FIXTURES / "tasks" / "deep_tanh_chain.py")
    with Judge(_config(cache_dir, max_rel_l2_ceiling=1e-5, max_rel_l2={"float32": 1e-5})) as j:
        v = j.check_reference(task)
    assert v.correct, v.failure
    assert v.ref_noise_rel_l2 > 1e-5 and v.rel_l2_bound == pytest.approx(1e-5 + 6 * v.ref_noise_rel_l2, rel=0.5)
    assert any("ill-conditioned" in w for w in v.task_warnings), v.task_warnings


def test_a_reference_that_is_rounding_noise_is_judged_elementwise_and_flagged_as_a_task(cache_dir):
    # the mean over each row of a normalised tensor is exactly zero: float32 gives rounding noise
    # that float64 does not share. Judged as KernelBench would (elementwise), said so in the notes,
    # and the task is flagged for task sets (an all-zero output passes it).
    task = _task("y = (x - x.mean(dim=1, keepdim=True)) / x.std(dim=1, keepdim=True)\nreturn y.mean(dim=1)")
    with Judge(_config(cache_dir)) as j:
        v = j.check_reference(task)
    assert v.correct, v.failure
    assert any("rounding noise" in n for n in v.notes), v.notes
    assert v.ref_noise_rel_l2 is None or v.ref_noise_rel_l2 >= 1.0
    assert any("all-zero output passes" in w for w in v.task_warnings), v.task_warnings
