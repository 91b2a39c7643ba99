"""Milestone reward: a pure function of the verdict."""

from __future__ import annotations

import pytest

from cuda_agent.judge.verdict import Failure, FailureCategory, Timing, Verdict
from cuda_agent.reward import Reward, RewardConfig, milestone_reward, reward_of, rewarded_faster, scored_summary


def timing(ms: float, source: str = "events") -> Timing:
    return Timing(median_ms=ms, mean_ms=ms, min_ms=ms * 0.9, max_ms=ms * 1.2,
                  p10_ms=ms * 0.95, p90_ms=ms * 1.1, std_ms=ms * 0.05, n=50, source=source)


def verdict(*, runtime: float | None = 1.0, eager: float | None = 1.0, compiled_ref: float | None = 1.0,
            compiled: bool = True, correct: bool = True, policy: list[str] | None = None,
            failure: Failure | None = None) -> Verdict:
    return Verdict(
        task_id="0123456789abcdef", task_name="1_Square", candidate_hash="fedcba9876543210",
        device="cpu", compiled=compiled, correct=correct, policy_violations=policy or [],
        failure=failure,
        runtime=timing(runtime) if runtime is not None else None,
        eager=timing(eager) if eager is not None else None,
        compiled_ref=timing(compiled_ref) if compiled_ref is not None else None,
        compile_mode="default",
    )


def score(**kw) -> Reward:
    base = dict(compiled=True, correct=True, policy_violations=[], failed=False,
                speedup_vs_eager=None, speedup_vs_compile=None)
    base.update(kw)
    return milestone_reward(**base)


# --- failures are -1 ---------------------------------------------------------------------------

def test_not_compiled():
    r = reward_of(verdict(compiled=False, correct=False,
                          failure=Failure(category=FailureCategory.COMPILE, message="nvcc: error")))
    assert r.value == -1
    assert "build" in r.reason


def test_not_compiled_beats_everything_else():
    # Even with impossible "fast and correct" inputs, an uncompiled candidate scores -1.
    r = score(compiled=False, speedup_vs_eager=10.0, speedup_vs_compile=10.0)
    assert r.value == -1 and r.reason == "did not build or load"


def test_policy_violation_is_fail_even_if_correct_and_fast():
    v = verdict(runtime=0.1, eager=1.0, compiled_ref=1.0,
                policy=["calls torch.nn.functional.conv2d in forward", "second"])
    assert v.speedup_vs_compile == pytest.approx(10.0)
    r = reward_of(v)
    assert r.value == -1
    assert r.reason == "policy: calls torch.nn.functional.conv2d in forward"


def test_failure_is_fail():
    v = verdict(failure=Failure(category=FailureCategory.RUNTIME, message="illegal memory access"))
    r = reward_of(v)
    assert r.value == -1
    assert "failed" in r.reason


def test_failure_with_correct_flag_still_fails():
    r = score(failed=True, speedup_vs_eager=3.0, speedup_vs_compile=3.0)
    assert r.value == -1


def test_incorrect_is_fail():
    v = verdict(correct=False, runtime=0.1, eager=1.0, compiled_ref=1.0,
                failure=Failure(category=FailureCategory.MISMATCH, message="max abs err 0.3"))
    assert v.speedup_vs_eager is None and v.speedup_vs_compile is None
    r = reward_of(v)
    assert r.value == -1
    assert "incorrect" in r.reason


def test_incorrect_without_failure_record():
    r = reward_of(verdict(correct=False, runtime=0.1))
    assert r.value == -1
    assert "incorrect" in r.reason


# --- the milestones ----------------------------------------------------------------------------

def test_correct_not_faster():
    r = reward_of(verdict(runtime=1.0, eager=1.0, compiled_ref=0.8))
    assert r.value == 1
    assert r.reason == "correct, not faster"


def test_correct_slower():
    assert reward_of(verdict(runtime=2.0, eager=1.0, compiled_ref=1.0)).value == 1


def test_correct_without_timings():
    # Correct but nothing to compare against: the correctness milestone only.
    r = reward_of(verdict(runtime=None, eager=None, compiled_ref=None))
    assert r.value == 1


def test_faster_than_eager_only():
    v = verdict(runtime=1.0, eager=1.5, compiled_ref=1.02)
    r = reward_of(v)
    assert r.value == 2
    assert r.reason == "correct, 1.50x vs eager"


def test_faster_than_compile():
    v = verdict(runtime=1.0, eager=2.0, compiled_ref=1.25)
    r = reward_of(v)
    assert r.value == 3
    assert r.reason == "correct, 1.25x vs torch.compile"


def test_faster_than_compile_but_not_eager_is_not_the_top_milestone():
    # torch.compile slower than eager on this task: beating it while merely matching eager is
    # correct, not faster; the top milestone needs both baselines beaten.
    r = reward_of(verdict(runtime=1.0, eager=1.0, compiled_ref=1.5))
    assert r.value == 1
    assert reward_of(verdict(runtime=1.0, eager=1.2, compiled_ref=1.5)).value == 3


def test_no_compile_baseline_caps_at_two():
    r = reward_of(verdict(runtime=1.0, eager=3.0, compiled_ref=None))
    assert r.value == 2


def test_boundary_exactly_five_percent():
    # 1.05x counts as "5% faster"; just under does not.
    assert reward_of(verdict(runtime=1.0, eager=1.05, compiled_ref=1.0)).value == 2
    assert reward_of(verdict(runtime=10.0, eager=10.5, compiled_ref=10.5)).value == 3
    assert reward_of(verdict(runtime=1.0, eager=1.0499, compiled_ref=1.0499)).value == 1
    assert score(speedup_vs_eager=1.05).value == 2
    assert score(speedup_vs_eager=1.05, speedup_vs_compile=1.05).value == 3
    assert score(speedup_vs_eager=1.049999, speedup_vs_compile=1.049999).value == 1


# --- configuration -----------------------------------------------------------------------------

def test_configurable_margins():
    strict = RewardConfig(eager_margin=0.2, compile_margin=0.5)
    assert reward_of(verdict(runtime=1.0, eager=1.1, compiled_ref=1.1), strict).value == 1
    assert reward_of(verdict(runtime=1.0, eager=1.2, compiled_ref=1.4), strict).value == 2
    assert reward_of(verdict(runtime=1.0, eager=1.2, compiled_ref=1.5), strict).value == 3
    lenient = RewardConfig(eager_margin=0.0, compile_margin=0.0)
    assert reward_of(verdict(runtime=1.0, eager=1.0, compiled_ref=2.0), lenient).value == 3
    assert reward_of(verdict(runtime=1.0, eager=1.0, compiled_ref=0.5), lenient).value == 2


def test_configurable_values():
    cfg = RewardConfig(fail=-5.0, correct=0.5, rewarded_faster_than_eager=0.75, rewarded_faster_than_compile=10.0)
    assert reward_of(verdict(compiled=False, correct=False), cfg).value == -5.0
    assert reward_of(verdict(policy=["x"]), cfg).value == -5.0
    assert reward_of(verdict(correct=False), cfg).value == -5.0
    assert reward_of(verdict(runtime=1.0, eager=1.0, compiled_ref=1.0), cfg).value == 0.5
    assert reward_of(verdict(runtime=1.0, eager=2.0, compiled_ref=1.0), cfg).value == 0.75
    assert reward_of(verdict(runtime=1.0, eager=2.0, compiled_ref=2.0), cfg).value == 10.0


def test_config_and_reward_are_frozen():
    import pydantic

    cfg = RewardConfig()
    with pytest.raises(pydantic.ValidationError):
        cfg.fail = 0.0
    r = score()
    with pytest.raises(pydantic.ValidationError):
        r.value = 3.0


def test_pure_same_inputs_same_output():
    v = verdict(runtime=1.0, eager=1.3, compiled_ref=1.1)
    assert reward_of(v) == reward_of(v) == reward_of(v.model_copy())
    assert milestone_reward(compiled=True, correct=True, policy_violations=(), failed=False,
                            speedup_vs_eager=1.3, speedup_vs_compile=1.1) == reward_of(v)


def test_reward_of_is_duck_typed():
    class Fake:
        compiled = True
        correct = True
        policy_violations: list[str] = []
        failure = None
        speedup_vs_eager = 1.2
        speedup_vs_compile = None

    assert reward_of(Fake()).value == 2


# --- the verdict's summary ---------------------------------------------------------------------

SUMMARY_KEYS = {"compiled", "correct", "policy_violations", "failure", "runtime_ms", "eager_ms",
                "compile_ms", "speedup_vs_eager", "speedup_vs_compile", "reward"}


def test_summary_keys_and_values():
    v = verdict(runtime=2.0, eager=3.0, compiled_ref=4.0)
    s = scored_summary(v)
    assert SUMMARY_KEYS <= set(s)
    assert s["compiled"] is True and s["correct"] is True
    assert s["policy_violations"] == [] and s["failure"] is None
    assert s["runtime_ms"] == 2.0 and s["eager_ms"] == 3.0 and s["compile_ms"] == 4.0
    assert s["speedup_vs_eager"] == pytest.approx(1.5)
    assert s["speedup_vs_compile"] == pytest.approx(2.0)
    assert s["reward"] == 3
    assert s["reward_reason"] == "correct, 2.00x vs torch.compile"
    assert s["runtime_spread_ms"] == [pytest.approx(1.9), pytest.approx(2.2)]
    assert s["timing_source"] == "events"


def test_summary_incorrect_has_no_speedups():
    v = verdict(correct=False, runtime=0.5, eager=3.0, compiled_ref=4.0,
                failure=Failure(category=FailureCategory.MISMATCH, message="shape (2,) != (3,)"))
    s = scored_summary(v)
    assert SUMMARY_KEYS <= set(s)
    assert s["speedup_vs_eager"] is None and s["speedup_vs_compile"] is None
    assert s["runtime_ms"] == 0.5  # the time is still reported, just not credited
    assert s["failure"] == {"category": "mismatch", "message": "shape (2,) != (3,)"}
    assert s["reward"] == -1


def test_summary_not_compiled():
    v = verdict(compiled=False, correct=False, runtime=None, eager=None, compiled_ref=None,
                policy=["no kernels"])
    s = v.summary()
    assert s["compiled"] is False
    assert s["runtime_ms"] is None and s["eager_ms"] is None and s["compile_ms"] is None
    assert s["speedup_vs_eager"] is None and s["speedup_vs_compile"] is None
    assert s["policy_violations"] == ["no kernels"]
    assert s["runtime_spread_ms"] is None


def test_summary_is_json_serialisable():
    import json

    v = verdict(failure=Failure(category=FailureCategory.TIMING, message="inside < outside"))
    assert json.loads(json.dumps(v.summary()))["failure"]["category"] == "timing"


# --- the judge measures, its readers score -------------------------------------------------------

def test_the_verdict_and_the_judge_config_carry_no_reward():
    from cuda_agent.judge import JudgeConfig

    v = verdict(runtime=1.0, eager=2.0, compiled_ref=2.0)
    assert not {"reward", "reward_reason"} & set(v.summary())
    assert not {"reward", "reward_reason"} & set(type(v).model_fields)
    assert "reward" not in JudgeConfig.model_fields
    # a verdict stored before the reward left it still loads (its old reward is dropped, not trusted)
    old = v.model_dump(mode="json") | {"reward": 3.0, "reward_reason": "old"}
    assert type(v).model_validate(old) == v


def test_the_two_thresholds_are_named_apart():
    from cuda_agent.metrics import beats

    # The benchmark's "beats eager": any speed-up above 1. The reward's "rewarded faster": 1 + margin.
    assert beats(1.01) and not beats(1.0) and not beats(None)
    assert not rewarded_faster(1.01, 0.05) and rewarded_faster(1.05, 0.05) and not rewarded_faster(None, 0.0)
    assert rewarded_faster(1.0, 0.0) and not beats(1.0)   # margin 0: "at least as fast", still not "beats"


def test_scoring_a_stored_verdict_again_under_another_margin():
    v = verdict(runtime=1.0, eager=1.08, compiled_ref=1.08)
    assert reward_of(v).value == 3
    assert reward_of(v, RewardConfig(eager_margin=0.1, compile_margin=0.1)).value == 1
    s = scored_summary(v, RewardConfig(compile_margin=0.1))
    assert s["reward"] == 2 and s["reward_reason"] == "correct, 1.08x vs eager"


def test_reward_config_refuses_unknown_fields():
    import pydantic

    with pytest.raises(pydantic.ValidationError):
        RewardConfig(faster_than_eager=2.0)
    with pytest.raises(pydantic.ValidationError):
        RewardConfig(eager_margin=-0.1)


def test_the_agent_ranks_verdicts_by_its_environments_reward():
    from cuda_agent.agent.loop import AgentConfig, rank
    from cuda_agent.reward import Reward

    assert AgentConfig(reward={"compile_margin": 0.2}).reward.compile_margin == 0.2
    v = verdict(runtime=1.0, eager=1.1, compiled_ref=1.1)
    strict = reward_of(v, RewardConfig(eager_margin=0.2, compile_margin=0.2))
    assert rank(v, reward_of(v)) > rank(v, strict) > rank(v, None)
    assert rank(v, Reward(value=2.0, reason="x")) < rank(verdict(runtime=0.5, eager=1.1), Reward(value=2.0, reason="x"))
