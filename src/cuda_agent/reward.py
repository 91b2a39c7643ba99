"""Milestone reward of CUDA Agent as a pure function of a verdict's measurements.

-1: did not build or load, wrong, or broke the policy; 1: correct; 2: correct and *rewarded faster* than
eager PyTorch; 3: correct and rewarded faster than both eager PyTorch and torch.compile (beating a
torch.compile that is slower than eager, while losing to eager, is no top milestone: the kernel
would still be the slowest way to run the task). "Rewarded faster" means a speed-up
of at least `1 + margin` (`rewarded_faster`): margins are fractions, 0.05 means "5% faster", i.e. a
speed-up >= 1.05. This is not the benchmark's "beats eager" (`cuda_agent.metrics.beats`: any
speed-up > 1.0), which counts what happened rather than what earns the milestone.

The judge never scores: a `Verdict` carries measurements only, and each reader of verdicts (the
agent's environment, the pool's RL callers, bench and its reports, `cuda-agent eval`) applies this
function with its own `RewardConfig`. So a changed margin re-scores stored verdicts instead of
invalidating them (a bench run resumes across it).
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field


class RewardConfig(BaseModel):
    """The milestone values and the margins that earn them. Settings: the `[reward]` table of a
    settings file, or `-c reward.FIELD=value` on the commands that score."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    fail: float = Field(-1.0, description="did not build or load, incorrect, a failure, or a policy violation")
    correct: float = Field(1.0, description="correct, not rewarded faster than eager PyTorch")
    rewarded_faster_than_eager: float = Field(
        2.0, description="correct and at least eager_margin faster than eager PyTorch")
    rewarded_faster_than_compile: float = Field(
        3.0, description="correct and rewarded faster than both eager PyTorch and torch.compile")
    eager_margin: float = Field(0.05, ge=0, description="fraction faster than eager that earns the milestone "
                                                        "(0.05: a speed-up of at least 1.05)")
    compile_margin: float = Field(0.05, ge=0, description="fraction faster than torch.compile that earns the "
                                                          "milestone")


class Reward(BaseModel):
    model_config = ConfigDict(frozen=True)
    value: float
    reason: str


class Scorable(Protocol):
    """What the reward reads of a verdict (`cuda_agent.judge.Verdict` has it; the protocol keeps
    this module free of judge imports)."""

    compiled: bool
    correct: bool
    policy_violations: list[str]
    failure: object | None

    @property
    def speedup_vs_eager(self) -> float | None: ...

    @property
    def speedup_vs_compile(self) -> float | None: ...


def rewarded_faster(speedup: float | None, margin: float) -> bool:
    """The reward's threshold: a speed-up of at least `1 + margin` (see the module docstring)."""
    return speedup is not None and speedup >= 1.0 + margin


def milestone_reward(
    *,
    compiled: bool,
    correct: bool,
    policy_violations: list[str] | tuple[str, ...],
    failed: bool,
    speedup_vs_eager: float | None,
    speedup_vs_compile: float | None,
    config: RewardConfig = RewardConfig(),
) -> Reward:
    """Pure scoring: no I/O, no global state. The verdict carries the inputs."""
    if not compiled:
        return Reward(value=config.fail, reason="did not build or load")
    if policy_violations:
        return Reward(value=config.fail, reason=f"policy: {policy_violations[0]}")
    if failed or not correct:
        return Reward(value=config.fail, reason="incorrect or failed")
    beats_eager = rewarded_faster(speedup_vs_eager, config.eager_margin)
    if beats_eager and rewarded_faster(speedup_vs_compile, config.compile_margin):
        return Reward(value=config.rewarded_faster_than_compile,
                      reason=f"correct, {speedup_vs_compile:.2f}x vs torch.compile")
    if beats_eager:
        return Reward(value=config.rewarded_faster_than_eager, reason=f"correct, {speedup_vs_eager:.2f}x vs eager")
    return Reward(value=config.correct, reason="correct, not faster")


def reward_of(verdict: Scorable, config: RewardConfig = RewardConfig()) -> Reward:
    """Reward of a verdict under `config`."""
    return milestone_reward(
        compiled=verdict.compiled,
        correct=verdict.correct,
        policy_violations=verdict.policy_violations,
        failed=verdict.failure is not None,
        speedup_vs_eager=verdict.speedup_vs_eager,
        speedup_vs_compile=verdict.speedup_vs_compile,
        config=config,
    )


def scored_summary(verdict, config: RewardConfig = RewardConfig()) -> dict:
    """A verdict's flat summary (`Verdict.summary()`) with its reward under `config` added: the
    `cuda-agent eval --json` contract."""
    r = reward_of(verdict, config)
    return verdict.summary() | {"reward": r.value, "reward_reason": r.reason}
