"""The one-GPU stages end to end on the CPU with the tiny random model and a scripted judge:
warm-up and agentic PPO steps, RFT, critic pre-training (and its round trip as verl's critic
checkpoint), LoRA with a shared critic and GRPO without one, and a run killed with SIGKILL that
resumes without losing or repeating a step, for each model combination."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from agent_server import RELU_TASK  # noqa: E402
from cuda_agent.train.config import TrainConfig  # noqa: E402
from cuda_agent.train.learner import latest_checkpoint  # noqa: E402
from cuda_agent.train.rollout import read_episodes, read_metrics  # noqa: E402
from cuda_agent.train.stages import critic_stage, load_critic, rft_stage, rollout_stage  # noqa: E402

from train_fakes import FakeGate  # noqa: E402

TASK = RELU_TASK


@pytest.fixture(scope="module")
def task_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tasks") / "relu.py"
    path.write_text(TASK)
    return path


def small(task_file: Path, **kw) -> TrainConfig:
    base = dict(tasks=str(task_file), steps=2, episodes_per_step=3, concurrency=2,
                episode={"turn_tokens": 24, "max_turns": 2}, ppo={"mini_batch": 3},
                optim={"actor_lr": 1e-3, "critic_lr": 1e-3})
    return TrainConfig(**{**base, **kw})


def test_warmup_then_agentic_ppo_write_episodes_metrics_and_checkpoints(tmp_path, task_file):
    gate = FakeGate()
    metrics = rollout_stage(small(task_file), tmp_path / "warmup", gate, mode="single_turn")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        assert m["episodes"] == 3 and m["reward_mean"] == -1.0 and "pg_loss" in m and "vf_loss" in m
        assert m["rollout_logprob_gap"] < 1e-4   # the trainer's logprobs are the sampler's
    eps = read_episodes([tmp_path / "warmup" / "episodes"])
    assert len(eps) == 6 and {e.mode for e in eps} == {"single_turn"}
    assert latest_checkpoint(tmp_path / "warmup").name == "step-000001"
    final = tmp_path / "warmup" / "final"
    assert (final / "actor" / "config.json").exists() and (final / "critic" / "config.json").exists()
    # agentic PPO starts from the warm-up's actor and critic
    cfg = small(task_file, model=str(final / "actor"), critic=str(final / "critic"), steps=1)
    metrics = rollout_stage(cfg, tmp_path / "ppo", gate, mode="agentic")
    ep = read_episodes([tmp_path / "ppo" / "episodes"])[0]
    assert ep.mode == "agentic" and 0 in ep.response_mask and 1 in ep.response_mask
    assert metrics[0]["turns_mean"] >= 1 and gate.judged >= 3


def _episodes(task_file, tmp_path) -> Path:
    """Stored episodes to learn from: a warm-up run whose judge finds every other episode correct."""

    class Alternating(FakeGate):
        def evaluate(self, task, cand):
            self.judged += 1
            from train_fakes import verdict

            return verdict(task, cand, correct=self.judged % 2 == 0)

    from cuda_agent.train.episode import EpisodeRecord

    out = tmp_path / "warmup"
    rollout_stage(small(task_file, steps=1, episodes_per_step=6), out, Alternating(), mode="single_turn")
    # the tiny model's replies hold no module, so give the judge's verdicts to the episodes directly
    path = out / "episodes" / "step-000000.jsonl"
    eps = read_episodes([path])
    fixed = [EpisodeRecord(**{**e.model_dump(), "reward": 2.0 if i % 2 == 0 else -1.0}) for i, e in enumerate(eps)]
    path.write_text("".join(e.model_dump_json() + "\n" for e in fixed))
    return out / "episodes"


def test_rft_keeps_positive_episodes_and_fits_them(tmp_path, task_file):
    episodes = _episodes(task_file, tmp_path)
    cfg = small(task_file, episodes=[str(episodes)], epochs=4, batch_episodes=3,
                model=str(tmp_path / "warmup" / "final" / "actor"), optim={"actor_lr": 3e-3})
    metrics = rft_stage(cfg, tmp_path / "rft")
    report = json.loads((tmp_path / "rft" / "rft_filter.json").read_text())
    assert report["kept"] == 3 and report["rejected"] == {"reward": 3}
    assert (tmp_path / "rft" / "rft.parquet").exists()
    assert metrics[-1]["sft_loss"] < metrics[0]["sft_loss"]
    assert (tmp_path / "rft" / "final" / "actor" / "config.json").exists()


def test_critic_pretraining_round_trip(tmp_path, task_file):
    episodes = _episodes(task_file, tmp_path)
    actor = tmp_path / "warmup" / "final" / "actor"
    cfg = small(task_file, episodes=[str(episodes)], epochs=6, batch_episodes=6, model=str(actor),
                optim={"critic_lr": 3e-3})
    metrics = critic_stage(cfg, tmp_path / "critic")
    assert metrics[-1]["value_loss"] < metrics[0]["value_loss"]
    # verl loads the critic as AutoModelForTokenClassification(num_labels=1) from critic.model.path
    from transformers import AutoModelForTokenClassification

    path = tmp_path / "critic" / "final" / "critic"
    critic = AutoModelForTokenClassification.from_pretrained(path, num_labels=1)
    assert critic.config.num_labels == 1 and any("TokenClassification" in a for a in critic.config.architectures)
    again = load_critic(path, "cpu")   # loading a trained critic keeps its head
    ep = read_episodes([episodes])[0]
    ids = torch.tensor([ep.prompt_ids + ep.response_ids])
    with torch.no_grad():
        assert torch.allclose(critic(input_ids=ids).logits, again(input_ids=ids).logits)


def test_lora_with_a_shared_critic_then_grpo_without_one(tmp_path, task_file):
    gate = FakeGate()
    cfg = small(task_file, lora={"r": 4}, critic_mode="shared",
                ppo={"mini_batch": 1, "kl_coef": 0.1, "entropy_coef": 0.01}, optim={"actor_lr": 1e-2,
                                                                                 "warmup_steps": 2})
    metrics = rollout_stage(cfg, tmp_path / "warmup", gate, mode="single_turn")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        assert m["optimizer_steps"] == 6 and m["kl_ref"] >= 0 and m["entropy"] > 0 and "vf_loss" in m
        assert m["rollout_logprob_gap"] < 1e-4   # the LoRA actor's logprobs are the sampler's
    assert metrics[0]["lr"] < metrics[1]["lr"] == 1e-2   # warm-up over the first two optimiser steps
    ckpt = latest_checkpoint(tmp_path / "warmup")
    assert (ckpt / "actor" / "adapter_config.json").exists() and (ckpt / "critic" / "value_head.pt").exists()
    final = tmp_path / "warmup" / "final"
    # the final actor is the adapter merged into the base: a plain model folder for the next stage
    assert (final / "actor" / "config.json").exists() and not (final / "actor" / "adapter_config.json").exists()
    assert (final / "critic" / "value_head.pt").exists()
    cfg = small(task_file, model=str(final / "actor"), episodes_per_step=4, steps=1,
                ppo={"estimator": "grpo", "group_size": 2, "kl_coef": 0.1})
    metrics = rollout_stage(cfg, tmp_path / "grpo", gate, mode="single_turn")
    eps = read_episodes([tmp_path / "grpo" / "episodes"])
    assert [e.task_id for e in eps][0] == eps[1].task_id   # a group of two episodes of one task
    assert "vf_loss" not in metrics[0] and metrics[0]["kl_ref"] >= 0
    assert not (latest_checkpoint(tmp_path / "grpo") / "critic").exists()   # no critic loaded, none saved


RUNNER = textwrap.dedent('''
    import json, sys, time
    sys.path.insert(0, sys.argv[3])
    from train_fakes import FakeGate
    from cuda_agent.train.config import TrainConfig
    from cuda_agent.train.stages import rollout_stage

    class Slow(FakeGate):
        def evaluate(self, task, cand):
            time.sleep(0.5)
            return super().evaluate(task, cand)

    settings = {"tasks": sys.argv[2], "steps": 3, "episodes_per_step": 2, "concurrency": 2,
                "episode": {"turn_tokens": 16, "max_turns": 1}, "ppo": {"mini_batch": 2}}
    cfg = TrainConfig(**{**settings, **json.loads(sys.argv[4])})
    rollout_stage(cfg, __import__("pathlib").Path(sys.argv[1]), Slow(), mode="single_turn")
''')


COMBINATIONS = {
    "separate-full": {},
    "shared-lora": {"critic_mode": "shared", "lora": {"r": 4}, "optim": {"warmup_steps": 3}},
    "grpo-lora-kl": {"lora": {"r": 4}, "ppo": {"estimator": "grpo", "group_size": 2, "kl_coef": 0.1}},
    "shared-full-kl": {"critic_mode": "shared", "ppo": {"mini_batch": 1, "kl_coef": 0.1}},
}


@pytest.mark.parametrize("combo", sorted(COMBINATIONS))
def test_a_killed_run_resumes_after_its_last_checkpoint(tmp_path, task_file, combo):
    out = tmp_path / "run"
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    argv = [sys.executable, str(script), str(out), str(task_file), str(Path(__file__).parent),
            json.dumps(COMBINATIONS[combo])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    deadline = time.monotonic() + 300
    while latest_checkpoint(out) is None:
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = [m["step"] for m in read_metrics(out / "metrics.jsonl")]
    assert done and done[0] == 0 and len(done) < 3
    subprocess.run(argv, env=env, check=True, timeout=600)
    steps = [m["step"] for m in read_metrics(out / "metrics.jsonl")]
    assert steps == [0, 1, 2]   # each step once: none lost, none repeated in the log
    if "warmup_steps" in COMBINATIONS[combo].get("optim", {}):
        # 2 optimiser steps a rollout step, warm-up over 3: the schedule's state survived the kill
        lrs = [m["lr"] for m in read_metrics(out / "metrics.jsonl")]
        assert lrs == pytest.approx([0.5e-6, 1e-6, 1e-6])
    assert latest_checkpoint(out).name == "step-000002"
    files = sorted(p.name for p in (out / "episodes").glob("*.jsonl"))
    assert files == ["step-000000.jsonl", "step-000001.jsonl", "step-000002.jsonl"]
    assert all(len(read_episodes([out / "episodes" / f])) == 2 for f in files)
    assert not list((out / "ckpt").glob(".*.tmp"))
