"""`train collect`: a model's agentic episodes over tasks, stored for RFT and the critic, without an
update; a rerun resumes after the last written step. The judge is the test's scripted evaluator, so
the stage's own plumbing is what is tested (the real judge is in test_train_stages)."""

from __future__ import annotations

import json

import torch

from cuda_agent.train.config import TrainConfig
from cuda_agent.train.episode import EpisodeConfig
from cuda_agent.train.rolloutbench import StandInJudge


def test_collect_stores_agentic_episodes_and_resumes_without_training(tmp_path):
    from cuda_agent.train.collect import collect_stage
    from cuda_agent.train.rollout import read_episodes

    torch.set_num_threads(1)
    cfg = TrainConfig(model="tiny", tasks="suite:cpu", limit=2, steps=2, episodes_per_step=2, concurrency=2,
                      episode=EpisodeConfig(max_turns=2, turn_tokens=8, context_tokens=20_000))
    out = tmp_path / "collect"
    metrics = collect_stage(cfg, out, StandInJudge("cpu"))
    assert [m["step"] for m in metrics] == [0, 1] and all(m["stage"] == "collect" for m in metrics)
    eps = read_episodes([out / "episodes"])
    assert len(eps) == 4 and all(e.mode == "agentic" and e.response_mask[-1] == 1 for e in eps)
    assert not (out / "ckpt").exists() and not (out / "final").exists()   # nothing was trained
    before = (out / "episodes" / "step-000000.jsonl").read_text()
    again = collect_stage(cfg.model_copy(update={"steps": 3}), out, StandInJudge("cpu"))
    assert [m["step"] for m in again] == [0, 1, 2]   # steps 0 and 1 kept, step 2 run
    assert (out / "episodes" / "step-000000.jsonl").read_text() == before
    assert json.loads((out / "config.json").read_text())["stage"] == "collect"


def test_rft_and_critic_read_collected_episodes_by_default(tmp_path):
    from cuda_agent.train.episode import EpisodeRecord
    from cuda_agent.train.rollout import write_episodes
    from cuda_agent.train.stages import _episodes

    ep = EpisodeRecord(id="w0", task_id="t", task_name="t", mode="single_turn", prompt_ids=[1], response_ids=[2],
                       response_mask=[1], response_logprobs=[0.0], messages=[], reward=1.0, reward_reason="r")
    write_episodes([ep], tmp_path / "warmup" / "episodes" / "step-000000.jsonl")
    (tmp_path / "collect" / "episodes").mkdir(parents=True)
    cfg = TrainConfig()
    assert _episodes(cfg, tmp_path / "rft") == []   # collect/episodes (empty here) comes first
    (tmp_path / "collect" / "episodes").rmdir()
    assert [e.id for e in _episodes(cfg, tmp_path / "rft")] == ["w0"]   # else the warm-up's
