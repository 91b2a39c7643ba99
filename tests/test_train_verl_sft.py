"""RFT through verl's SFT data path: an episode of `CudaAgentLoop` with two tool calls in one turn
(consecutive tool messages, which verl's stock per-message rendering cannot reproduce for grouping
templates) exported by `rft.write_sft_parquet`, read by the dataset class rft.sh names, built the
way verl's SFT trainer builds it (`create_sft_dataset` with rft.sh's data config composed by
Hydra): the tokens SFT trains on are the tokens RL sampled, observations out of the loss.

Runs in verl's environment (.venv-verl; skipped where verl is not installed)."""

from __future__ import annotations

import json

import pytest

from agent_server import RELU_TASK  # noqa: E402
from cuda_agent.tasks import Task
from cuda_agent.train.episode import EpisodeRecord
from cuda_agent.train.rft import write_sft_parquet
from cuda_agent.train.verl_config import launch_settings, write_verl_configs
from train_fakes import FakeGate
from verl_fakes import LIST, SUBMIT, ScriptedServer, compose, need_verl, run_loop, script_overrides

TWO_CALLS = LIST + "\n" + ('<tool_call>\n{"name": "write_file", "arguments": {"path": "model_new.py", '
                           '"content": "# GOOD\\n"}}\n</tool_call>')


@pytest.fixture(scope="module")
def episode(tmp_path_factory):
    need_verl()
    from omegaconf import OmegaConf

    from cuda_agent.train.tiny import build_tiny

    tmp = tmp_path_factory.mktemp("sft")
    _, tok = build_tiny(tmp / "tiny")
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 4096}},
                               "cuda_agent": {"judge": {"device": "cpu"}, "workdir": str(tmp),
                                              "episodes_dir": str(tmp / "episodes"),
                                              "episode": {"max_turns": 5, "turn_tokens": 512}}})
    replies = [TWO_CALLS, SUBMIT]
    out = run_loop(config, tok, ScriptedServer(tok, replies), Task.from_source(RELU_TASK, name="relu"), FakeGate())
    assert out.reward_score == 2.0
    line = next((tmp / "episodes").glob("*.jsonl")).read_text().splitlines()[0]
    sampled = [t for r in replies for t in tok.encode(r, add_special_tokens=False) + [tok.eos_token_id]]
    return EpisodeRecord.model_validate(json.loads(line)), tok, sampled, tmp


def _dataset(episode, *extra: str):
    from verl.trainer.sft_trainer import create_sft_dataset

    ep, tok, _, tmp = episode
    parquet = write_sft_parquet([ep], tmp / "rft-data" / "rft.parquet")
    launch = launch_settings("one-node", None, [f"base_model={tmp / 'tiny'}", f"out={tmp}"])
    write_verl_configs(launch, tmp / "scripts")
    config = compose("sft_trainer_engine", [*script_overrides(tmp / "scripts" / "rft.sh", "verl.trainer.sft_trainer"),
                                            *extra])
    assert config.data.train_files == str(parquet)
    return create_sft_dataset([str(parquet)], config.data, tok, None)


def test_the_episode_has_consecutive_tool_messages(episode):
    roles = [m["role"] for m in episode[0].messages]
    assert any(a == b == "tool" for a, b in zip(roles, roles[1:])), roles


def test_sft_trains_on_the_tokens_rl_sampled(episode):
    ep, _, sampled, _ = episode
    item = _dataset(episode)[0]
    ids, loss = item["input_ids"].tolist(), item["loss_mask"].tolist()
    assert ids == ep.prompt_ids + ep.response_ids
    assert [t for t, m in zip(ids, loss) if m] == sampled   # the model's tokens, nothing else, as sampled
    assert loss == [0] * len(ep.prompt_ids) + ep.response_mask


def test_right_padding_keeps_the_same_tokens_and_mask(episode):
    ep, _, sampled, _ = episode
    item = _dataset(episode, "data.pad_mode=right", "data.max_length=16384")[0]
    n = len(ep.prompt_ids) + len(ep.response_ids)
    assert item["input_ids"].shape[0] == 16384 and int(item["attention_mask"].sum()) == n
    assert [t for t, m in zip(item["input_ids"].tolist(), item["loss_mask"].tolist()) if m] == sampled


def test_an_episode_over_max_length_is_an_error_not_a_cut(episode):
    ds = _dataset(episode, "data.max_length=64", "data.truncation=right")
    with pytest.raises(ValueError, match="over data.max_length=64"):
        ds[0]
