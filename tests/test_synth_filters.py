"""Each filter rejects its planted bad case, with its reason, and keeps the honest task.

Execution filters run in real sandboxed worker processes (CPU, torch.compile off except in the
one compile test); a crash or a hang of a task must cost only that task.
"""

from __future__ import annotations

import pytest
import torch

from cuda_agent.synth.compose import Composition
from cuda_agent.synth.decontam import BenchmarkIndex, DecontamConfig, operator_sequence
from cuda_agent.synth.filters import FilterConfig, StaticFilter, Worker, WorkerPool

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\nBATCH = 16\n\n"
TAIL_1 = "\n\ndef get_inputs():\n    return [torch.randn(BATCH, 64)]\n\n\ndef get_init_inputs():\n    return []\n"


def task(init: str, forward: str, tail: str = TAIL_1, head: str = HEAD) -> str:
    return (head + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            + "".join(f"        {ln}\n" for ln in (init.splitlines() or ["pass"]))
            + "\n    def forward(self, x):\n" + "".join(f"        {ln}\n" for ln in forward.splitlines()) + tail)


GOOD = task("self.fc = nn.Linear(64, 128)", "return F.gelu(self.fc(x))")
TWO_INPUTS = (task("", "return torch.tanh(x)").replace("def forward(self, x):", "def forward(self, x, y):")
              .replace("return [torch.randn(BATCH, 64)]", "return [torch.randn(BATCH, 64), torch.randn(BATCH, 64)]"))
PLANTED = {
    "random_op": task("self.fc = nn.Linear(64, 64)", "return F.dropout(self.fc(x), 0.5, self.training)"),
    "nondeterministic": task("self.calls = 0", "self.calls += 1\nreturn x * self.calls"),
    "train_eval_mismatch": task("self.bn = nn.BatchNorm1d(64)", "return self.bn(x)"),
    "nonfinite": task("", "return torch.log(x)"),
    "constant_output": task("", "return torch.zeros_like(x) + 3.0"),
    "input_independent": task("self.w = nn.Parameter(torch.randn(64))", "return self.w.expand(x.shape[0], 64) + 0.0 * x.sum()"),
    "degenerate": task("", "return x * 1e-6"),
    "unused_parameter": task("self.fc = nn.Linear(64, 64)\nself.unused = nn.Linear(64, 64)", "return torch.relu(self.fc(x))"),
    "unused_input": TWO_INPUTS,
    "eager_error": task("self.fc = nn.Linear(32, 64)", "return self.fc(x)"),
    # shortcuts at the judge's tolerance (shortcuts.shortcut_checks)
    "droppable_parameter": task("self.w = nn.Parameter(torch.randn(64, 64))", "return x @ torch.tril(self.w)"),
    "hardcodable_parameter": task("self.ln = nn.LayerNorm(64)", "return self.ln(x)"),
    "batch_mixing": task("", "return x - x.mean(dim=0, keepdim=True)"),
    "ill_conditioned": task("", "return torch.sin(x * 1e5)"),
    "droppable_input": TWO_INPUTS.replace("return torch.tanh(x)", "return torch.tanh(x) + 1e-6 * y"),
    "load_error": task("", "return x").replace("import torch\n", "import torch\nimport no_such_module_here\n"),
}


def fast_config(**kw) -> FilterConfig:
    base = dict(device="cpu", min_ms=0.0, max_ms=1e4, compile=False, timeout_s=60, n_timed=3, n_warmup=1)
    return FilterConfig(**(base | kw))


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(fast_config(), 1) as p:
        yield p


def test_honest_task_is_kept(pool):
    r = pool.check(GOOD)
    assert r.accepted and r.rejection is None, r
    assert r.eager_ms is not None and r.eager_ms > 0
    assert r.input_shapes == [[16, 64]] and r.output_shapes == [[16, 128]]
    assert {"eager", "random", "train_eval", "degenerate", "usage", "runtime_window", "criterion"} <= set(r.passed)
    # the time split covers each stage that ran (no compile check in this config), and nothing else
    assert set(r.stage_s) == {"load", "trace", "values", "shortcuts", "window", "final_values", "criterion"}, r.stage_s
    assert all(v >= 0 for v in r.stage_s.values()) and sum(r.stage_s.values()) <= r.check_s + 1e-3


def test_a_rejected_tasks_time_is_its_rejecting_stages(pool):
    r = pool.check(PLANTED["batch_mixing"])
    assert r.rejection is not None and r.rejection.filter == "batch_mixing"
    # batch mixing is found by the shortcut checks: the split ends there
    assert list(r.stage_s) == ["load", "trace", "values", "shortcuts"], r.stage_s


@pytest.mark.parametrize("expected", sorted(PLANTED))
def test_planted_bad_case_is_rejected_with_its_reason(pool, expected):
    r = pool.check(PLANTED[expected])
    assert not r.accepted
    assert r.rejection is not None and r.rejection.filter == expected, r.rejection
    assert r.rejection.message


def test_shortcut_messages_name_what_passes(pool):
    r = pool.check(PLANTED["droppable_parameter"])
    assert "upper triangle" in r.rejection.message and "input set" in r.rejection.message
    # a constant that matches nearly every element (a spike at one sample), and a tiny bias
    spiky = task("", "return 50.0 + 10.0 * torch.relu(x - 2.5)")
    r = pool.check(spiky)
    assert r.rejection.filter == "degenerate" and "nearly constant" in r.rejection.message, r.rejection
    tiny = task("self.fc = nn.Linear(64, 64)\nself.b = nn.Parameter(torch.randn(64) * 1e-5)", "return self.fc(x) + self.b")
    r = pool.check(tiny)
    assert r.rejection.filter == "droppable_parameter" and "parameter b" in r.rejection.message


def test_a_discontinuity_of_a_computed_value_is_ill_conditioned(pool):
    """frac() of a linear layer's output: a 1e-6 input jitter (an honest kernel's rounding) flips
    an element across an integer now and then, far outside the tolerance."""
    r = pool.check(task("self.fc = nn.Linear(64, 64)", "return torch.frac(self.fc(x) * 1000.0)"))
    assert r.rejection is not None and r.rejection.filter == "ill_conditioned", r.rejection


def _two_input_task(body: str, shape: str) -> str:
    return (HEAD + "class Model(nn.Module):\n    def forward(self, x, y):\n        return " + body + "\n\n\n"
            f"def get_inputs():\n    return [torch.randn({shape}), torch.randn({shape})]\n\n\n"
            "def get_init_inputs():\n    return []\n")


@pytest.mark.parametrize("body, shape, why", [
    # a jump at an integer of a computed value, about one set in a hundred
    ("torch.frac((x + y) * 3.0)", "BATCH, 16", "an op that jumps at a boundary"),
    # angle of a real value: 0 or pi by its sign (the audit's `sum_angle` task)
    ("torch.angle(torch.sin((x + y) * 9.42477796))", "BATCH, 16", "an op that jumps at a boundary"),
    # heavy tails: a near-singular matrix, a near-cancelling difference, now and then
    ("torch.inverse(x + y)", "1, 3, 3", "a near miss"),
    ("1.0 / (x - y)", "1, 4", "a near miss"),
])
def test_a_rare_jitter_failure_is_found_on_the_suspects_extra_sets(body, shape, why):
    """Tasks that leave the tolerance under a 1e-6 jitter on one input set in ~100: the first 30
    sets all pass (so without the extra sets the task would be exported), the 300 that its trace or
    its near misses ask for find it (in-process, CPU, fixed seeds)."""
    from cuda_agent.synth.shortcuts import shortcut_checks
    from cuda_agent.synth.worker import Reject, Runner

    source = _two_input_task(body, shape)
    shortcut_checks(Runner(source, "cpu"), fast_config(jitter_sets_suspect=30).payload(), source)
    with pytest.raises(Reject) as rej:
        shortcut_checks(Runner(source, "cpu"), fast_config().payload(), source)
    assert rej.value.filter == "ill_conditioned" and "of 300 tried" in rej.value.message and why in rej.value.message


def test_a_continuous_task_with_a_suspect_op_is_kept_after_the_extra_sets():
    """`where` and a comparison make a task suspect, and a ReLU written with them is continuous:
    the extra sets cost time, not the task."""
    from cuda_agent.synth.shortcuts import shortcut_checks
    from cuda_agent.synth.worker import Runner, jumps_at_boundaries

    source = _two_input_task("torch.where(x + y > 0, x + y, torch.zeros_like(x))", "BATCH, 64")
    assert jumps_at_boundaries([], source)
    shortcut_checks(Runner(source, "cpu"), fast_config().payload(), source)


def test_a_task_that_declares_it_mixes_the_batch_is_kept(pool):
    mixing = PLANTED["batch_mixing"].replace("BATCH = 16\n", "BATCH = 16\nMIXES_BATCH = True\n")
    r = pool.check(mixing)
    assert r.accepted, r.rejection


def test_random_op_reason_names_the_op(pool):
    r = pool.check(task("", "return x + torch.rand_like(x)"))
    assert r.rejection.filter == "random_op" and "rand" in r.rejection.message


def test_runtime_window_rescales_batch_toward_the_window_and_rejects_what_cannot_reach_it():
    slow_enough = task("self.fc = nn.Linear(64, 256)", "return F.gelu(self.fc(x))").replace("BATCH = 16", "BATCH = 1")
    with WorkerPool(fast_config(min_ms=0.3, max_ms=50.0, n_timed=5), 1) as p:
        r = p.check(slow_enough)
        assert r.accepted, r.rejection
        assert r.batches[0] == 1 and r.batches[-1] > 1 and "BATCH = 1\n" not in r.source
        assert 0.3 <= r.eager_ms <= 50.0
        fixed = slow_enough.replace("BATCH = 1\n", "").replace("BATCH", "1")   # no constant to rescale
        r = p.check(fixed)
        assert r.rejection is not None and r.rejection.filter == "runtime_window"
        assert "outside [0.3, 50]" in r.rejection.message


OOM = 'raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")'


def test_running_out_of_gpu_memory_is_its_own_filter():
    with WorkerPool(fast_config(), 1) as p:
        r = p.check(task("", OOM))
        assert r.rejection is not None and r.rejection.filter == "out_of_memory", r.rejection
        assert p.check(GOOD).accepted


def test_a_rescale_that_runs_out_of_memory_backs_off_toward_the_last_size_that_ran():
    """Rescaling estimates memory from inputs and outputs only; a size whose forward runs out of
    memory is halved back toward the last good size instead of losing the task."""
    sleepy = task("", f"if x.shape[0] > 64:\n    {OOM}\n__import__('time').sleep(x.shape[0] * 2e-5)\nreturn x * 2.0")
    # the window's target (20 ms) asks for BATCH ~ 250, which runs out; backing off reaches a size
    # <= 64 that runs (where exactly depends on the timing at BATCH 1, so only the bounds are fixed)
    with WorkerPool(fast_config(min_ms=0.8, max_ms=500.0, target_ms=20.0, n_timed=3), 1) as p:
        r = p.check(sleepy.replace("BATCH = 16", "BATCH = 1"))
        assert r.accepted, r.rejection
        assert r.batches[0] == 1 and 1 < r.batches[-1] <= 64 and r.eager_ms >= 0.8, (r.batches, r.eager_ms)
        assert f"BATCH = {r.batches[-1]}\n" in r.source


def test_checks_that_run_out_of_memory_after_the_window_retry_at_half_the_batch():
    """The checks after the runtime window hold several outputs at once: a size whose timing ran can
    run out there (simulated: the eval-mode run at BATCH > 100). Half the BATCH, still in the window,
    is checked instead; once halving leaves the window the task is out_of_memory."""
    sleepy = task("", f"if not self.training and x.shape[0] > 100:\n    {OOM}\n"
                      "__import__('time').sleep(x.shape[0] * 2e-5)\nreturn x * 2.0").replace("BATCH = 16", "BATCH = 1")
    # A target far above the threshold: the rescale from BATCH 1 divides by a time that is mostly
    # fixed overhead, which load multiplies; BATCH lands at 400-1300, well past 100 either way.
    with WorkerPool(fast_config(min_ms=0.8, max_ms=500.0, target_ms=100.0, n_timed=3), 1) as p:
        r = p.check(sleepy)     # the window asks for a BATCH whose eval-mode run runs out
        assert r.accepted, r.rejection
        assert r.batches[0] == 1 and r.batches[-2] > 100 and 1 < r.batches[-1] <= 100, r.batches
        assert f"BATCH = {r.batches[-1]}\n" in r.source and r.eager_ms >= 0.8
        r = p.check(sleepy.replace("> 100", "> 20"))     # half of it would leave the window
        assert r.rejection is not None and r.rejection.filter == "out_of_memory", r.rejection
        assert "outside" in r.rejection.message


def test_the_batch_that_fits_the_checks_scales_what_the_timed_runs_held():
    from cuda_agent.synth.worker import memory_batch

    mib = 2**20
    held = {"held": 100 * mib, "weights": 10 * mib}
    # (1000 - 3 x 10) MiB of room, 4 x 100 MiB at BATCH 64: BATCH 155 fits
    assert memory_batch(held, 64, 1000 * mib, 4.0) == 155
    assert memory_batch(held, 64, 1000 * mib, 8.0) == 77
    assert memory_batch(held, 64, None, 4.0) is None          # no cap known (the CPU, in-process checks)
    assert memory_batch(held, 64, 1000 * mib, 0.0) is None    # the bound switched off
    assert memory_batch({}, 64, 1000 * mib, 4.0) is None      # nothing measured
    assert memory_batch(held, 64, 20 * mib, 4.0) == 0         # not even the weights fit


def test_workers_sharing_a_gpu_split_it(monkeypatch):
    from cuda_agent.synth.worker import gpu_memory_cap

    gib = 2**30
    assert gpu_memory_cap(140 * gib, 16384, 1) == pytest.approx(16 / 140)     # the limit fits: the limit
    assert gpu_memory_cap(140 * gib, 16384, 8) == pytest.approx(0.9 / 8)      # 8 x 16 GiB would not: a share
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    pool = WorkerPool(FilterConfig(device="cuda"), 5)     # workers start on first use: none here
    assert [w.gpu_share for w in pool._all] == [3] * 5     # GPU 3 takes slots 0, 2, 4


def test_a_crashing_or_hanging_task_costs_only_that_task():
    with WorkerPool(fast_config(timeout_s=8), 1) as p:
        r = p.check(task("", "import os\nos.abort()"))
        assert r.rejection.filter == "crash"
        r = p.check(task("", "while True:\n    pass"))
        assert r.rejection.filter == "timeout"
        assert p.check(GOOD).accepted     # a fresh worker took over


def test_worker_is_replaced_after_its_task_budget():
    w = Worker(fast_config(tasks_per_worker=1), 0)
    try:
        assert w.check(GOOD).accepted and w.proc is None     # closed after one task
        assert w.check(GOOD).accepted                         # and started afresh on demand
    finally:
        w.close()


@pytest.mark.slow
def test_compile_filter_keeps_a_matching_task_and_rejects_a_mismatch():
    mismatch = task("", "if torch.compiler.is_compiling():\n    return x * 2.0\nreturn x * 3.0")
    w = Worker(fast_config(compile=True, timeout_s=300), 0)
    try:
        r = w.check(GOOD)
        assert r.accepted and r.compile_ms is not None and "compile" in r.passed, r.rejection
        r = w.check(mismatch)
        assert r.rejection is not None and r.rejection.filter == "compile_mismatch", r.rejection
    finally:
        w.close()


BENCH_TASK = '''import torch
import torch.nn as nn

BATCH = 128


class Model(nn.Module):
    """Conv2d, ReLU, then a bias added after the activation."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1))

    def forward(self, x):
        return torch.relu(self.conv(x)) + self.bias


def get_inputs():
    return [torch.randn(BATCH, 64, 32, 32)]


def get_init_inputs():
    return [64, 128]
'''


def comp(source: str, name: str = "t") -> Composition:
    return Composition(name=name, source=source, ops=("x",), seed=0, composer="programmatic")


@pytest.fixture()
def bench(tmp_path):
    (tmp_path / "level2").mkdir()
    (tmp_path / "level2" / "3_Conv2d_ReLU_BiasAdd.py").write_text(BENCH_TASK)
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "19_ReLU.py").write_text(task("", "return torch.relu(x)"))
    (tmp_path / "scripts.py").write_text("print('not a task')\n")
    return BenchmarkIndex.from_dir(tmp_path, cache=tmp_path / "traces.jsonl")


def test_benchmark_index_reads_tasks_and_skips_other_files(bench):
    assert len(bench) == 2 and bench.skipped == 1


def test_near_copy_of_a_benchmark_file_is_contaminated(bench):
    renamed = (BENCH_TASK.replace("self.conv", "self.c").replace("BATCH", "N").replace("128", "96")
               .replace("in_channels", "cin").replace('"""Conv2d, ReLU, then a bias added after the activation."""', ""))
    rej, near, _ = StaticFilter(bench).check(comp(renamed))
    assert rej is not None and rej.filter == "contaminated" and "3_Conv2d_ReLU_BiasAdd" in rej.message
    assert near.ast_equal
    # same ops written another way: caught by the operator sequence
    other = task("self.conv = nn.Conv2d(64, 32, 3)\nself.b = nn.Parameter(torch.zeros(32, 1, 1))",
                 "y = F.relu(self.conv(x))\nreturn torch.add(y, self.b)")
    assert operator_sequence(other) == operator_sequence(BENCH_TASK) == ["conv2d", "relu", "add"]
    rej, near, _ = StaticFilter(bench).check(comp(other))
    assert rej is not None and rej.filter == "contaminated" and near.ops == 1.0


def test_distinct_task_passes_decontamination_with_its_nearest_recorded(bench):
    rej, near, _ = StaticFilter(bench).check(comp(GOOD))
    assert rej is None
    assert near is not None and near.name and near.score < 0.8


def test_thresholds_are_configurable(bench):
    strict = StaticFilter(bench, DecontamConfig(minhash_threshold=0.05, ops_threshold=0.05))
    rej, _, _ = strict.check(comp(GOOD))
    assert rej is not None and rej.filter == "contaminated"


def test_duplicates_up_to_names_and_sizes_are_removed():
    f = StaticFilter()
    assert f.check(comp(GOOD, "a"))[0] is None
    resized = GOOD.replace("128", "256").replace("self.fc", "self.proj")
    rej = f.check(comp(resized, "b"))[0]
    assert rej is not None and rej.filter == "duplicate" and "a" in rej.message
    assert f.check(comp("x = 1\n", "c"))[0].filter == "invalid_source"


@pytest.mark.gpu
def test_a_device_side_assert_is_the_tasks_eager_error_and_the_next_task_still_runs():
    """GPU kernels fail asynchronously: an index out of range must be blamed on the task's forward
    (eager_error), not on the checker (worker_error), and must not poison the next task."""
    bad = task("", "idx = torch.full((x.shape[0],), 10**6, device=x.device)\nreturn x[idx]")
    with WorkerPool(fast_config(device="cuda"), 1) as p:
        r = p.check(bad)
        assert r.rejection is not None and r.rejection.filter == "eager_error", r.rejection
        assert p.check(GOOD).accepted


@pytest.mark.gpu
def test_inputs_are_drawn_on_the_device_repeatably_and_on_the_cpu_where_get_inputs_needs_it():
    """The checks draw inputs on the GPU (seconds saved per GB-sized set); one seed must still give
    the same inputs every time, and a get_inputs that only runs on the CPU must still work."""
    from cuda_agent.synth.worker import Runner

    r = Runner(GOOD, "cuda")
    a, b = r.inputs(3)[0], r.inputs(3)[0]
    assert a.is_cuda and torch.equal(a, b) and not torch.equal(a, r.inputs(4)[0])
    cpu_gen = GOOD.replace("return [torch.randn(", "g = torch.Generator().manual_seed(0)\n    return [torch.randn(")
    cpu_gen = cpu_gen.replace("64)]", "64, generator=g)]")
    assert "generator=g" in cpu_gen
    x = Runner(cpu_gen, "cuda").inputs(3)[0]
    assert x.is_cuda and x.shape == a.shape


@pytest.mark.gpu
def test_shortcut_checks_run_on_the_cpu_only_for_tasks_that_are_cheap_there():
    """A small composed task's shortcut checks go to the worker's CPU (same weights as on the GPU);
    one whose forward is slow there stays on the GPU, and shortcut_cpu_ms=0 keeps every task there.
    A real worker on CUDA says where they ran and still rejects a planted shortcut."""
    from cuda_agent.synth.shortcuts import shortcut_runner
    from cuda_agent.synth.worker import Runner

    cfg = fast_config(device="cuda", shortcut_cpu_ms=10.0).payload()
    r = Runner(GOOD, "cuda")
    on = shortcut_runner(r, GOOD, cfg)
    assert on.device == "cpu"
    assert all(torch.equal(a.cpu(), b) for a, b in zip(r.model().state_dict().values(), on.model().state_dict().values()))
    heavy = task("self.fc = nn.Linear(64, 4096)", "x = self.fc(x)\nreturn x @ x.t() @ x").replace("BATCH = 16", "BATCH = 4096")
    assert shortcut_runner(Runner(heavy, "cuda"), heavy, cfg).device == "cuda"
    assert shortcut_runner(r, GOOD, fast_config(device="cuda", shortcut_cpu_ms=0).payload()) is r

    with WorkerPool(fast_config(device="cuda", shortcut_cpu_ms=10.0), 1) as p:
        good = p.check(GOOD)
        assert good.accepted and good.shortcut_device == "cpu", good.rejection
        bad = p.check(PLANTED["droppable_parameter"])
        assert bad.rejection is not None and bad.rejection.filter == "droppable_parameter", bad.rejection


@pytest.mark.gpu
def test_the_window_keeps_batch_where_the_later_checks_fit_the_workers_gpu_share():
    """A memory-bound task reaches the window (1 ms) only at a size whose later checks cannot fit a
    512 MiB share: out_of_memory at the window, after its timings, with no final check run. A
    compute-bound one reaches it well within the share: accepted, with what its timed runs and
    its later checks held recorded (the measure behind check_memory_multiple)."""
    cfg = fast_config(device="cuda", min_ms=1.0, max_ms=100.0, gpu_memory_mb=512, shortcuts=False, criterion_sets=3)
    wide = task("", "return torch.tanh(x) * 2.0").replace("BATCH, 64)", "BATCH, 1 << 16)")   # 256 KiB a sample
    deep = task("self.w = nn.Parameter(torch.randn(1024, 1024) / 32)",
                "for _ in range(50):\n    x = torch.tanh(x @ self.w)\nreturn x").replace("BATCH, 64)", "BATCH, 1024)")
    with WorkerPool(cfg, 1) as p:
        r = p.check(wide)
        assert r.rejection is not None and r.rejection.filter == "out_of_memory", r.rejection
        assert "memory share" in r.rejection.message and "final_values" not in r.stage_s, (r.rejection, r.stage_s)
        r = p.check(deep)
        assert r.accepted, r.rejection
        assert 1.0 <= r.eager_ms <= 100.0 and r.memory_mb["held"] > 0 and r.memory_mb["checks"] > 0, r.memory_mb


def test_workers_take_the_visible_gpus_in_turn(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    cfg = FilterConfig(device="cuda")
    assert [Worker(cfg, k)._gpu_env()["CUDA_VISIBLE_DEVICES"] for k in range(3)] == ["3", "5", "3"]
    assert Worker(FilterConfig(device="cpu"), 1)._gpu_env() == {"CUDA_VISIBLE_DEVICES": "3,5"}


# -- decontamination by what runs --------------------------------------------------------------------

SWISH = task("self.fc = nn.Linear(64, 128)", "x = self.fc(x)\nx = x * torch.sigmoid(x)\nreturn x * 2.0")


def _edits(src: str) -> dict[str, str]:
    """Meaning-preserving rewrites the static measures missed (see cuda_agent.synth.edits, `cuda-agent synth decontam`)."""
    return {
        "silu": src.replace("x = x * torch.sigmoid(x)", "x = F.silu(x)"),
        "alias": src.replace("class Model(", "class DenseStack(") + "\n\nModel = DenseStack\n",
        "subclass": src.replace("class Model(", "class Original(") + "\n\nclass Model(Original):\n    pass\n",
        "noop": src.replace("x = self.fc(x)\n", "x = self.fc(x)\n        x = x * 1.0\n        x = x + 0\n"),
        "helper": src.replace("def forward(self, x):", "def forward(self, x):\n        return _impl(self, x)\n\n"
                              "    def unused(self, x):") + "\n\ndef _impl(self, x):\n    x = self.fc(x)\n"
                              "    x = x * torch.sigmoid(x)\n    return x * 2.0\n",
    }


def test_traced_operators_survive_aliases_subclasses_helpers_noops_and_silu():
    from cuda_agent.synth.trace import traced_ops

    base = traced_ops(SWISH)
    assert base == ["t", "mm", "add", "sigmoid", "mul", "mul"] or base == ["mm", "add", "sigmoid", "mul", "mul"], base
    for kind, src in _edits(SWISH).items():
        assert traced_ops(src) == base, kind


def test_edited_copies_are_caught_by_the_trace_and_distinct_tasks_are_not(tmp_path):
    from cuda_agent.synth.trace import trace_many

    (tmp_path / "level2").mkdir()
    (tmp_path / "level2" / "59_Matmul_Swish_Scaling.py").write_text(SWISH)
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "19_ReLU.py").write_text(task("", "return torch.relu(x)"))
    index = BenchmarkIndex.from_dir(tmp_path, cache=tmp_path / "traces.jsonl")
    assert all(e.trace for e in index.entries)
    edits = _edits(SWISH)
    others = {"good": GOOD, "tanh_cumsum": task("", "return torch.cumsum(torch.tanh(x), dim=-1)")}
    traces = trace_many([*edits.values(), *others.values()])
    f = StaticFilter(index)
    for (kind, src), tr in zip(edits.items(), traces):
        rej, near = f.check_trace(src, tr)
        assert rej is not None and rej.filter == "contaminated" and "59_Matmul_Swish" in rej.message, (kind, near)
        assert near.traced and near.trace == 1.0
    for (name, src), tr in zip(others.items(), traces[len(edits):]):
        rej, near = f.check_trace(src, tr)
        assert rej is None, (name, near)
    # the cache answers the second time without a child process
    again = BenchmarkIndex.from_dir(tmp_path, cache=tmp_path / "traces.jsonl")
    assert [e.trace for e in again.entries] == [e.trace for e in index.entries]


def test_minhash_is_not_renumbered_by_a_new_name():
    from cuda_agent.synth.decontam import jaccard, minhash

    longer = SWISH.replace("x = self.fc(x)\n", "unused_scale = 3\n        x = self.fc(x)\n")
    assert jaccard(minhash(SWISH), minhash(longer)) >= 0.8
    renamed = SWISH.replace("self.fc", "self.projection").replace("(self, x)", "(self, inp)").replace("x", "inp")
    assert jaccard(minhash(SWISH), minhash(renamed)) == 1.0


def test_static_operator_sequence_follows_aliases_subclasses_and_helpers():
    base = operator_sequence(SWISH)
    assert base == ["linear", "sigmoid", "mul", "mul"]
    for kind in ("alias", "subclass", "helper"):
        assert operator_sequence(_edits(SWISH)[kind]) == base, kind
