"""The bundled suite: its tasks load and behave, and every bundled solution passes the strict judge."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.candidate import Candidate
from cuda_agent.judge import Judge, JudgeConfig
from cuda_agent.suite import suite_solutions, suite_tasks
from cuda_agent.tasks import Task

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


def _run_reference(task: Task, scale_down: bool):
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
    a, b = _run_reference(task, scale_down=False)
    a = a[0] if isinstance(a, (tuple, list)) else a
    b = b[0] if isinstance(b, (tuple, list)) else b
    assert torch.isfinite(a).all()
    assert not torch.equal(a, b), "output does not depend on the inputs"
    assert float(a.double().std()) > 0, "constant output"


@pytest.fixture(scope="module")
def cpu_judge(tmp_path_factory):
    with Judge(JudgeConfig(device="cpu", compile_mode="none", n_timed=5,
                           cache_dir=tmp_path_factory.mktemp("suite-cache"))) as j:
        yield j


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CPU_SOLUTIONS), ids=str)
def test_cpu_solution_passes(name: str, cpu_judge: Judge):
    task = next(t for t in CPU_TASKS if t.name == name)
    v = cpu_judge.evaluate(task, Candidate.from_path(CPU_SOLUTIONS[name]))
    assert v.correct and v.reward >= 1 and not v.policy_violations, v.summary()


@pytest.fixture(scope="module")
def cuda_judge(tmp_path_factory):
    with Judge(JudgeConfig(device="cuda", compile_mode="none", n_timed=10,
                           cache_dir=tmp_path_factory.mktemp("suite-cuda-cache"))) as j:
        yield j


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CUDA_SOLUTIONS), ids=str)
def test_cuda_solution_passes(name: str, cuda_judge: Judge):
    task = next(t for t in CUDA_TASKS if t.name == name)
    v = cuda_judge.evaluate(task, Candidate.from_path(CUDA_SOLUTIONS[name]))
    assert v.correct and v.reward >= 1 and not v.policy_violations, v.summary()
