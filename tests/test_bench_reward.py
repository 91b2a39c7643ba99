"""A bench run is scored by its reader, not by the judge: a changed reward margin re-scores the
run's stored verdicts and the run resumes; a changed judge setting is still refused. A run stored
while the reward was a judge setting resumes too. The pool's scripted stand-in judge
(tests/pool_fakes.py) gives verdicts with the runtimes the solutions name, in seconds."""

from __future__ import annotations

import json

import pytest

from cuda_agent.bench import run_bench, settings_digest
from cuda_agent.db import DBError, ResultsDB
from cuda_agent.judge import JudgeConfig
from cuda_agent.pool import PoolConfig
from cuda_agent.reward import RewardConfig

TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * {k}.0

def get_inputs():
    return [torch.randn(64)]

def get_init_inputs():
    return []
'''

# The scripted judge times eager at 2.0 ms: 1.9 ms is a 1.053x speed-up, 1.0 ms a 2x one.
RUNTIMES = {"1_Tanh_x1": 1.9, "2_Tanh_x2": 1.0, "3_Tanh_x3": 1.9}


def write_pair(root, name: str) -> None:
    k = int(name[0])
    (root / "tasks" / "level1" / f"{name}.py").write_text(TASK.format(k=k))
    (root / "solutions" / f"{name}.py").write_text(f"class ModelNew: pass\n# runtime: {RUNTIMES[name]}\n")


def bench(tmp_path, config: JudgeConfig, reward: RewardConfig, out=None):
    return run_bench(str(tmp_path / "tasks"), tmp_path / "solutions", config, db_path=tmp_path / "r.sqlite",
                     run_name="r", out=out, reward=reward,
                     pool_config=PoolConfig(judge_factory="pool_fakes:ScriptedJudge", compile_workers=0))


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "tasks" / "level1").mkdir(parents=True)
    (tmp_path / "solutions").mkdir()
    for name in ("1_Tanh_x1", "2_Tanh_x2"):
        write_pair(tmp_path, name)
    return JudgeConfig(device="cpu", policy="lenient", compile_mode="none", n_timed=3, cache_dir=tmp_path / "cache")


def rewards(out) -> dict[str, float]:
    return {r["task_name"]: r["reward"] for r in map(json.loads, out.read_text().splitlines())}


def test_a_changed_reward_margin_rescores_and_resumes(tmp_path, setup):
    config, out = setup, tmp_path / "run.jsonl"
    first = bench(tmp_path, config, RewardConfig(eager_margin=0.05), out)
    assert first.judged_now == 2
    assert rewards(out) == {"1_Tanh_x1": 2.0, "2_Tanh_x2": 2.0}     # 1.053x and 2x are both >= 1.05

    write_pair(tmp_path, "3_Tanh_x3")
    second = bench(tmp_path, config, RewardConfig(eager_margin=0.1), out)
    assert second.already_done == 2 and second.judged_now == 1       # resumed: only the new pair judged
    assert rewards(out) == {"1_Tanh_x1": 1.0, "2_Tanh_x2": 2.0, "3_Tanh_x3": 1.0}   # all scored at 1.1
    with ResultsDB(tmp_path / "r.sqlite") as db:
        run = db.run("r")
        assert run.reward() == RewardConfig(eager_margin=0.1)          # the latest invocation's reward
        assert "reward" not in run.info["config"]                      # not a judge setting
    # the benchmark's "beats eager" does not move with the reward's margin
    assert second.table.overall.beats_eager_rate == 1.0

    with pytest.raises(DBError, match="other judge settings"):       # a judge setting still matters
        bench(tmp_path, config.model_copy(update={"n_timed": 4}), RewardConfig())


def test_a_run_stored_with_the_reward_among_the_judge_settings_resumes(tmp_path, setup):
    """Before the reward left the judge, a run's digest and stored config covered it."""
    config = setup
    old_config = config.model_dump(mode="json") | {"reward": {"faster_than_eager": 2.0, "eager_margin": 0.2}}
    import hashlib

    old_digest = hashlib.sha256(json.dumps({k: v for k, v in old_config.items()
                                            if k not in {"cache_dir", "sandbox_uid", "use_zygote"}},
                                           sort_keys=True).encode()).hexdigest()[:12]
    assert old_digest != settings_digest(config)
    with ResultsDB(tmp_path / "r.sqlite") as db:
        db.open_run("r", spec=str(tmp_path / "tasks"), device="cpu", settings_digest=old_digest,
                    info={"config": old_config})
        assert db.run("r").reward() == RewardConfig(eager_margin=0.2)   # old field names read too
    result = bench(tmp_path, config, RewardConfig())
    assert result.judged_now == 2
    with ResultsDB(tmp_path / "r.sqlite") as db:
        assert db.run("r").settings_digest == settings_digest(config)


def test_a_setting_added_later_leaves_the_digest_of_earlier_runs_at_its_old_behaviour(setup):
    """`gate_release`, `release_writes`, `flush_after_inputs` and `touch_pages` came after runs were stored: at their
    earlier behaviour ('off' for flush_after_inputs, whose default is now 'auto') a stored config
    without them has the same digest, so those runs resume; at another value it differs. `device_lock` says where the judge runs, not what it decides: never in the digest."""
    config = setup.model_copy(update={"flush_after_inputs": "off"})
    later = {"gate_release", "release_writes", "flush_after_inputs", "touch_pages", "device_lock"}
    stored = {k: v for k, v in config.model_dump(mode="json").items() if k not in later}
    assert settings_digest(stored) == settings_digest(config)
    assert settings_digest(config.model_copy(update={"gate_release": "judge"})) != settings_digest(config)
    assert settings_digest(config.model_copy(update={"release_writes": "host"})) != settings_digest(config)
    assert settings_digest(config.model_copy(update={"flush_after_inputs": "on"})) != settings_digest(config)
    # its default now ('auto': inputs over the L2's size) times calls otherwise than runs stored before it
    assert setup.flush_after_inputs == "auto" and settings_digest(setup) != settings_digest(config)
    assert settings_digest(config.model_copy(update={"touch_pages": True})) != settings_digest(config)
    assert settings_digest(config.model_copy(update={"device_lock": "/tmp/x.lock"})) == settings_digest(config)
    # the precision probe (approx_rel_l2) came later too: off (0) is the earlier behaviour, and its
    # default (on) is another setting, so a run stored before it does not resume under it
    off = config.model_copy(update={"approx_rel_l2": 0.0})
    before_probe = {k: v for k, v in off.model_dump(mode="json").items() if k != "approx_rel_l2"}
    assert settings_digest(before_probe) == settings_digest(off) != settings_digest(config)
