"""Milestone reward of CUDA Agent as a pure function of a verdict.

-1: did not compile, wrong, or broke the policy; 1: correct; 2: correct and at least
`eager_margin` faster than eager PyTorch; 3: correct and at least `compile_margin` faster
than torch.compile. Margins are fractions: 0.05 means "5% faster", i.e. a speed-up >= 1.05.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RewardConfig(BaseModel):
    model_config = ConfigDict(frozen=True)
    fail: float = -1.0
    correct: float = 1.0
    faster_than_eager: float = 2.0
    faster_than_compile: float = 3.0
    eager_margin: float = 0.05
    compile_margin: float = 0.05


class Reward(BaseModel):
    model_config = ConfigDict(frozen=True)
    value: float
    reason: str


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
        return Reward(value=config.fail, reason="did not compile")
    if policy_violations:
        return Reward(value=config.fail, reason=f"policy: {policy_violations[0]}")
    if failed or not correct:
        return Reward(value=config.fail, reason="incorrect or failed")
    if speedup_vs_compile is not None and speedup_vs_compile >= 1.0 + config.compile_margin:
        return Reward(value=config.faster_than_compile,
                      reason=f"correct, {speedup_vs_compile:.2f}x vs torch.compile")
    if speedup_vs_eager is not None and speedup_vs_eager >= 1.0 + config.eager_margin:
        return Reward(value=config.faster_than_eager, reason=f"correct, {speedup_vs_eager:.2f}x vs eager")
    return Reward(value=config.correct, reason="correct, not faster")


def reward_of(verdict, config: RewardConfig = RewardConfig()) -> Reward:
    """Reward of a `Verdict` (duck-typed to keep this module free of judge imports)."""
    return milestone_reward(
        compiled=verdict.compiled,
        correct=verdict.correct,
        policy_violations=verdict.policy_violations,
        failed=verdict.failure is not None,
        speedup_vs_eager=verdict.speedup_vs_eager,
        speedup_vs_compile=verdict.speedup_vs_compile,
        config=config,
    )
