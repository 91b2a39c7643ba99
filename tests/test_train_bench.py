"""The rollout benchmark runs agentic episodes through the real engine and tools with a stand-in
judge: every episode acts out the whole script (ten turns, ending in a submission)."""

from __future__ import annotations

import torch

from cuda_agent.train.rolloutbench import StandInJudge, run_rollout_bench, script


def test_rollout_bench_acts_out_the_script_through_the_real_tools(tmp_path):
    torch.set_num_threads(1)
    fig = run_rollout_bench(shape="tiny", episodes=2, turns=len(script("x")), prompt_tokens=64, reply_tokens=8,
                            device="cpu", workdir=tmp_path, ignore_eos=True)
    assert fig.episodes == 2 and fig.terminations == {"submitted": 2}   # the tenth call submits
    assert fig.turns_mean == len(script("x")) and fig.generated_tokens_per_s > 0
    assert fig.prompt_tokens > 1000   # the real system prompt, skill document and tools


def test_the_stand_in_judge_answers_like_an_evaluator():
    from cuda_agent.candidate import Candidate
    from cuda_agent.tasks import Task

    judge = StandInJudge("cpu")
    task = Task.from_source("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
                            "def get_inputs():\n    return [torch.randn(2)]\ndef get_init_inputs():\n    return []\n",
                            name="identity")
    v = judge.evaluate(task, Candidate.from_source("class ModelNew:\n    pass\n"))
    assert v.correct and v.speedup_vs_eager and judge.build(None).compiled and judge.calls == 1
