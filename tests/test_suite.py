"""The bundled suite: its tasks load and behave, and every bundled solution passes the strict judge."""

from __future__ import annotations

import pytest
import torch

from conftest import build_ahead_in_parallel, judge_cache_dir, selected_params
from cuda_agent.candidate import Candidate
from cuda_agent.judge import Judge, JudgeConfig
from cuda_agent.suite import suite_solutions, suite_tasks
from cuda_agent.tasks import Task
from cuda_agent.reward import reward_of

CUDA_TASKS = suite_tasks("cuda")
CPU_TASKS = suite_tasks("cpu")
CPU_SOLUTIONS = suite_solutions("cpu")
CUDA_SOLUTIONS = suite_solutions("cuda")


def test_suite_size_and_shape():
    assert len(CUDA_TASKS) >= 24
    levels = {t.level for t in CUDA_TASKS}
    assert levels == {1, 2, 3}
    assert len({t.name for t in CUDA_TASKS}) == len(CUDA_TASKS), "task names must be unique across levels"
    assert len(CUDA_SOLUTIONS) >= 6
    forms = {Candidate.from_path(p).kind for p in CUDA_SOLUTIONS.values()}
    assert forms == {"file", "workspace"}
    assert {t.name for t in CPU_TASKS} <= {t.name for t in CUDA_TASKS}
    assert set(CPU_SOLUTIONS) <= {t.name for t in CPU_TASKS}
    assert set(CUDA_SOLUTIONS) <= {t.name for t in CUDA_TASKS}


def _run_reference(task: Task):
    module: dict = {}
    exec(compile(task.source, task.origin, "exec"), module)
    torch.manual_seed(0)
    model = module["Model"](*module["get_init_inputs"]())
    torch.manual_seed(1)
    inputs = module["get_inputs"]()
    torch.manual_seed(2)
    other = module["get_inputs"]()
    with torch.no_grad():
        a, b = model(*inputs), model(*other)
    return a, b


@pytest.mark.parametrize("task", CPU_TASKS, ids=lambda t: t.name)
def test_cpu_tasks_are_deterministic_and_input_dependent(task: Task):
    a, b = _run_reference(task)
    a = a[0] if isinstance(a, (tuple, list)) else a
    b = b[0] if isinstance(b, (tuple, list)) else b
    assert torch.isfinite(a).all()
    assert not torch.equal(a, b), "output does not depend on the inputs"
    assert float(a.double().std()) > 0, "constant output"


@pytest.fixture(scope="module")
def suite_cache(tmp_path_factory):
    return judge_cache_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def judges(suite_cache, request):
    """One judge per backend for the module, created on first use; builds shared through one cache,
    the CPU solutions this session judges compiled into it ahead, several at once."""
    made: dict[str, Judge] = {}
    ahead = {"cpu": [CPU_SOLUTIONS[name] for name in selected_params(request.session, __file__,
                                                                     "test_cpu_solution_passes", "name")]}

    def get(device: str) -> Judge:
        if device not in made:
            config = JudgeConfig(device=device, compile_mode="none", n_timed=5 if device == "cpu" else 10,
                                 cache_dir=suite_cache)
            build_ahead_in_parallel(ahead.get(device, []), config)
            made[device] = Judge(config)
        return made[device]

    yield get
    for j in made.values():
        j.close()


def _passes(device: str, name: str, judges) -> None:
    tasks, solutions = (CPU_TASKS, CPU_SOLUTIONS) if device == "cpu" else (CUDA_TASKS, CUDA_SOLUTIONS)
    task = next(t for t in tasks if t.name == name)
    v = judges(device).evaluate(task, Candidate.from_path(solutions[name]))
    assert v.correct and reward_of(v).value >= 1 and not v.policy_violations, v.summary()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CPU_SOLUTIONS), ids=str)
def test_cpu_solution_passes(name: str, judges):
    _passes("cpu", name, judges)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CUDA_SOLUTIONS), ids=str)
def test_cuda_solution_passes(name: str, judges):
    _passes("cuda", name, judges)


@pytest.mark.slow
def test_bench_cli_runs_the_cpu_suite(suite_cache, tmp_path):
    """The main job on a machine without a GPU: `cuda-agent bench` over the bundled suite (level 1 here;
    the builds are already cached by the tests above)."""
    import json
    import subprocess
    import sys

    out, report = tmp_path / "verdicts.jsonl", tmp_path / "report.html"
    res = subprocess.run([sys.executable, "-m", "cuda_agent.cli", "bench", "suite", "--device", "cpu", "--level", "1",
                          "--compile-mode", "none", "-c", "n_timed=5", "-c", f"cache_dir={json.dumps(str(suite_cache))}",
                          "--out", str(out), "--report", str(report)], capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "pass rate" in res.stdout and "geomean" in res.stdout and "fast_1.5" in res.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = {n for n in CPU_SOLUTIONS if next(t for t in CPU_TASKS if t.name == n).level == 1}
    assert {r["task_name"] for r in rows} == expected
    assert all(r["correct"] and r["reward"] >= 1 for r in rows), [(r["task_name"], r["failure"]) for r in rows]
    assert report.read_text().count('<tr data-task="') == len(expected)
    assert (suite_cache / "results.sqlite").exists(), "verdicts go to the results database in the cache folder"
