"""The verl path: task files as RL parquet, the launch configs, and the `cuda_agent` agent loop
driven by a fake token server inside a running event loop (as verl's own CPU tests do); the loop's
tests skip without verl."""

from __future__ import annotations

import asyncio
import json

import pyarrow.parquet as pq
import pytest

from agent_server import RELU_TASK  # noqa: E402
from cuda_agent.tasks import Task, load_tasks
from cuda_agent.train.verl_config import VerlLaunch, write_verl_configs
from cuda_agent.train.verl_data import write_rl_parquet

TASK = RELU_TASK


def test_rl_parquet_rows_carry_the_task_and_the_loop(tmp_path):
    tasks = load_tasks("suite:cpu")
    paths = write_rl_parquet(tasks, tmp_path, device="cpu", val_fraction=0.2)
    train = pq.read_table(paths["train"]).to_pylist()
    val = pq.read_table(paths["val"]).to_pylist()
    assert len(train) + len(val) == len(tasks) and val
    row = train[0]
    assert row["agent_name"] == "cuda_agent"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    task = Task.model_validate_json(row["extra_info"]["task"])
    assert task.id == row["reward_model"]["ground_truth"] and task.source in row["prompt"][1]["content"]
    assert {t.id for t in tasks} == {Task.model_validate_json(r["extra_info"]["task"]).id for r in train + val}


def test_single_turn_rows_ask_for_a_whole_module(tmp_path):
    paths = write_rl_parquet(load_tasks("suite:cpu")[:2], tmp_path, device="cpu", mode="single_turn")
    row = pq.read_table(paths["train"]).to_pylist()[0]
    assert row["extra_info"]["mode"] == "single_turn" and "```python" in row["prompt"][1]["content"]
    with pytest.raises(ValueError):
        write_rl_parquet(load_tasks("suite:cpu")[:1], tmp_path, device="cpu", mode="bogus")


def test_launch_configs_name_the_loop_the_critic_and_the_long_context(tmp_path):
    files = write_verl_configs(VerlLaunch(base_model="/m/base", actor="/m/rft", critic="/m/critic", data="/d",
                                          out=str(tmp_path / "run")), tmp_path)
    names = {p.name for p in files}
    assert names == {"agent_loop.yaml", "prepare.sh", "warmup.sh", "collect.sh", "rft.sh", "critic.sh", "ppo.sh",
                     "README.txt"}
    ppo = (tmp_path / "ppo.sh").read_text()
    for line in ["algorithm.adv_estimator=gae", "critic.model.path=/m/critic", "rollout.calculate_log_probs=true",
                 "rollout_correction.rollout_is=token", "max_assistant_turns=150", "max_model_len=131072",
                 "agent_loop_config_path=", "ulysses_sequence_parallel_size=8", "'trainer.logger=[console]'",
                 "trainer.val_before_train=false", f"+cuda_agent.episodes_dir={tmp_path / 'run' / 'episodes' / 'ppo'}"]:
        assert line in ppo, line
    assert "cuda_agent.train.verl_loop.CudaAgentLoop" in (tmp_path / "agent_loop.yaml").read_text()
    rft = (tmp_path / "rft.sh").read_text()
    assert "data.messages_key=messages" in rft and "CudaAgentSFTDataset" in rft and "optim.lr=1e-05" in rft


# ---------------------------------------------------------------------------------------------
# The agent loop (needs verl)


def _loop_env():
    pytest.importorskip("verl.experimental.agent_loop.agent_loop")
    pytest.importorskip("transformers")


def test_agent_loop_output_masks_tool_tokens_and_carries_the_judges_reward(tmp_path):
    _loop_env()
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.workers.rollout.replica import TokenOutput

    from cuda_agent.train import verl_loop
    from cuda_agent.train.episode import ChatRenderer
    from cuda_agent.train.tiny import build_tokenizer

    from train_fakes import FakeGate

    tok = build_tokenizer()
    renderer = ChatRenderer(tok)
    replies = ['<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>',
               '<tool_call>\n{"name": "write_file", "arguments": {"path": "model_new.py", "content": "# GOOD\\n"}}\n'
               '</tool_call>',
               '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>']

    class FakeServer:
        def __init__(self):
            self.requests = []

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            self.requests.append((request_id, list(prompt_ids), dict(sampling_params)))
            ids = renderer.encode(replies[len(self.requests) - 1]) + [tok.eos_token_id]
            return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids))

    gate = FakeGate()
    verl_loop.CudaAgentLoop.gate_factory = staticmethod(lambda cfg: gate)
    verl_loop.CudaAgentLoop._gates = {}
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 4096}},
                               "cuda_agent": {"judge": {"device": "cpu"}, "workdir": str(tmp_path),
                                              "episodes_dir": str(tmp_path / "episodes"),
                                              "episode": {"max_turns": 5, "turn_tokens": 512}}})
    server = FakeServer()
    task = Task.from_source(TASK, name="relu")

    async def main():
        loop = verl_loop.CudaAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tok,
                                       processor=None, dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})))
        return await loop.run({"temperature": 1.0}, extra_info={"task": task.model_dump_json(), "mode": "agentic"},
                              raw_prompt=[])

    try:
        out = asyncio.run(main())
    finally:
        verl_loop.CudaAgentLoop.gate_factory = None
        verl_loop.CudaAgentLoop._gates = {}
    assert out.reward_score == 2.0 and out.extra_fields["reward_extra_info"]["termination"] == "submitted"
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    assert sum(out.response_mask) == sum(len(renderer.encode(r)) + 1 for r in replies)
    assert all(lp == -0.25 for lp, m in zip(out.response_logprobs, out.response_mask) if m == 1)
    # one sticky request id per episode; each turn's prompt is everything before it, token for token
    assert len({r[0] for r in server.requests}) == 1
    seq = out.prompt_ids + out.response_ids
    for _, prompt, params in server.requests:
        assert seq[: len(prompt)] == prompt and params["max_tokens"] <= 512
    stored = (tmp_path / "episodes").glob("*.jsonl")
    lines = [json.loads(line) for f in stored for line in f.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["reward"] == 2.0
