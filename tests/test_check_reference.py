"""`Judge.check_reference`: the judge's checks of a task on its own (what `cuda-agent synth`'s
sample is held to). Real harness, real isolated process, CPU backend."""

from __future__ import annotations

import pytest

from cuda_agent.judge import Judge, JudgeConfig
from cuda_agent.judge.verdict import FailureCategory
from cuda_agent.tasks import Task

from conftest import judge_cache_dir

HEAD = "import torch\nimport torch.nn as nn\n\n"
TAIL = ("\n\ndef get_inputs():\n    return [torch.randn(8, 256)]\n\n\n"
        "def get_init_inputs():\n    return []\n")


def make_task(forward: str, init: str = "pass", head: str = HEAD, name: str = "t") -> Task:
    source = (head + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              f"        {init}\n\n    def forward(self, x):\n"
              + "".join(f"        {line}\n" for line in forward.splitlines()) + TAIL)
    return Task.from_source(source, name=name)


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    cfg = JudgeConfig(device="cpu", compile_mode="none", n_timed=3, n_warmup=1,
                      cache_dir=judge_cache_dir(tmp_path_factory))
    with Judge(cfg) as j:
        yield j


def test_an_honest_task_passes_with_its_eager_time(judge):
    v = judge.check_reference(make_task("return torch.tanh(self.fc(x))", init="self.fc = nn.Linear(256, 256)"))
    assert v.correct and v.failure is None, v.failure
    assert v.candidate_hash == "reference" and v.eager is not None and v.eager.median_ms > 0
    assert v.n_checked >= 5 and not v.task_warnings


def test_what_candidates_may_not_write_is_fine_in_a_reference(judge):
    """Candidate policy (no `types`, no shadowing `input`) is not the task's business."""
    task = make_task("input = x\nns = types.SimpleNamespace(scale=2.0)\nreturn input * ns.scale",
                     head="import types\n" + HEAD)
    v = judge.check_reference(task)
    assert v.correct, v.failure


def test_a_reference_that_does_not_reproduce_in_another_process_fails(judge):
    v = judge.check_reference(make_task("return x + torch.randn_like(x)"))
    assert not v.correct and v.failure.category == FailureCategory.MISMATCH, v.failure


def test_a_reference_that_raises_fails_with_the_reason(judge):
    v = judge.check_reference(make_task("return x @ torch.ones(3, 3)"))
    assert not v.correct and v.failure is not None and "mat" in v.failure.message.lower(), v.failure


def test_degenerate_outputs_are_reported(judge):
    v = judge.check_reference(make_task("return x * 1e-6"))
    assert v.correct and v.task_warnings, v


@pytest.mark.gpu
def test_on_the_gpu_an_honest_task_passes_and_a_random_one_fails(tmp_path_factory):
    cfg = JudgeConfig(device="cuda", compile_mode="none", n_timed=3, n_warmup=1,
                      cache_dir=judge_cache_dir(tmp_path_factory))
    with Judge(cfg) as judge:
        v = judge.check_reference(make_task("return torch.tanh(self.fc(x))", init="self.fc = nn.Linear(256, 256)"))
        assert v.correct and v.eager is not None and v.eager.median_ms > 0, v.failure
        v = judge.check_reference(make_task("return x + torch.randn_like(x)"))
        assert not v.correct and v.failure.category == FailureCategory.MISMATCH, v.failure


def test_check_tasks_runs_the_checks_in_parallel_judge_processes():
    from cuda_agent.synth.judgecheck import check_tasks

    good = make_task("return torch.tanh(x)").source
    bad = make_task("return x + torch.randn_like(x)").source
    seen = []
    got = check_tasks([("good", good), ("bad", bad), ("broken", "not python (")], "cpu", parallel=2,
                      on_result=seen.append)
    assert sorted(got) == sorted(r.name for r in seen) == ["bad", "broken", "good"]
    assert got["good"].ok and got["good"].eager_ms > 0 and got["good"].failure is None
    assert not got["bad"].ok and got["bad"].failure
    assert not got["broken"].ok and "Error" in got["broken"].failure    # a task the judge cannot take, with why


def test_a_task_that_ran_out_of_gpu_memory_is_checked_again_alone(tmp_path):
    """Judges sharing a GPU can run out of memory together: such a failure is not the task's
    verdict. The task (planted: its first forward ever raises torch's out-of-memory error) is
    checked again by one judge, whose verdict alone is reported."""
    from cuda_agent.synth.judgecheck import check_tasks

    mark = tmp_path / "ran-once"
    head = HEAD + f"import os\n\nMARK = {str(mark)!r}\n\n"
    planted = make_task("if not os.path.exists(MARK):\n"
                        "    try:\n        open(MARK, 'w').close()\n    except OSError:\n        pass\n"
                        "    else:\n        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 8.00 GiB')\n"
                        "return torch.tanh(x)", head=head).source
    always = make_task("raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 8.00 GiB')").source
    seen = []
    got = check_tasks([("planted", planted), ("always", always), ("good", make_task("return torch.relu(x)").source)],
                      "cpu", parallel=2, on_result=seen.append)
    assert mark.exists()
    assert got["planted"].ok and not got["planted"].out_of_memory, got["planted"]
    assert not got["always"].ok and got["always"].out_of_memory and "out of memory" in got["always"].failure
    assert got["good"].ok
    # each task's verdict reported once: the first, crowded, out-of-memory verdicts are not
    assert sorted(r.name for r in seen) == ["always", "good", "planted"]
