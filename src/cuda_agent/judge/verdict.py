"""Typed records the judge produces. A verdict records what happened (measurements only); the
reward is a pure function of it that its readers apply (`cuda_agent.reward`)."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.hardware.sol import SpeedOfLight


class FailureCategory(str, Enum):
    """Why a candidate failed. One category per boundary, never a parsed string."""

    LOAD = "load"                    # candidate file/workspace malformed: no ModelNew, syntax error
    POLICY = "policy"                # forbidden construct or forbidden work (fallback, tampering)
    COMPILE = "compile"              # the C++/CUDA build failed
    COMPILE_TIMEOUT = "compile_timeout"
    INIT = "init"                    # ModelNew() raised
    RUNTIME = "runtime"              # forward raised (bad shapes, CUDA error, illegal address)
    CRASH = "crash"                  # the candidate process died (segfault, abort, killed)
    TIMEOUT = "timeout"              # a call or the whole run exceeded its limit
    OOM = "oom"                      # host or device memory limit
    RESOURCE = "resource"            # disk, processes or other machine resources beyond their limits
    MISMATCH = "mismatch"            # wrong values, shape, dtype or structure
    TIMING = "timing"                # timing claims that the outside clock contradicts, work left in flight
    TAMPERING = "tampering"          # the candidate changed judge files or global state it must not touch
    JUDGE = "judge"                  # the judge itself broke (never the candidate's fault)


class Failure(BaseModel):
    model_config = ConfigDict(frozen=True)
    category: FailureCategory
    message: str


class Timing(BaseModel):
    """Per-call times of one implementation, in milliseconds."""

    model_config = ConfigDict(frozen=True)
    median_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float
    std_ms: float
    n: int
    # how the times were taken: "gated" (CUDA events behind the timing gate: GPU work only, launch
    # gaps excluded), "events" (CUDA events around the call), "cpu" (the process's perf_counter) or
    # "outside" (the judge's own clock, when the claims were not believed)
    source: str = "events"


class CallRecord(BaseModel):
    """One call of the candidate as seen by the trusted side."""

    index: int
    role: str                   # "check" | "warmup" | "timed"
    inside_ms: float | None     # time the candidate process claimed
    outside_ms: float | None    # parent's clock minus calibrated overhead
    # CUDA, gated calls, as the process reports it: its events' time from the start marker to the end
    # marker; inside_ms is longer where the device stayed busy past the end marker (a side stream)
    stream_ms: float | None = None
    # CUDA, gated calls, as the process reports it (diagnostics; timing.device_busy_ms): how far the
    # idle marker lagged the end marker (side-stream work plus the host's reaction), and how long the
    # timing thread waited for a core in that time (a loaded core makes the marker late)
    lag_ms: float | None = None
    run_delay_ms: float | None = None
    # CUDA, checked calls, as the process reports it: the device time of the call's kernels and
    # copies in CUDA's activity records (as Nsight Compute reads them). A diagnostic set beside the
    # timed calls' gated time (slow inside the kernels, or between them?); never a time the judge uses.
    kernel_ms: float | None = None
    max_abs_err: float | None = None
    rel_l2_err: float | None = None           # against the reference (its own dtype)
    rel_l2_err_f64: float | None = None       # against the reference evaluated in float64 (checked calls)
    ref_noise_rel_l2: float | None = None     # the reference's own error against its float64 evaluation
    rel_l2_bound: float | None = None         # the bound applied: to rel_l2_err_f64 when that is set, else to rel_l2_err
    ok: bool = True


class SanitizerRun(BaseModel):
    """One checked call of the candidate under NVIDIA compute-sanitizer (JudgeConfig.memcheck,
    judge/memcheck.py). `errors`: the count the sanitizer's summary gives (None: no summary seen);
    the verdict follows its exit status, which the candidate's process cannot set."""

    model_config = ConfigDict(frozen=True)
    tool: str                        # "memcheck" | "racecheck"
    exit_code: int | None            # None: killed at its time limit
    errors: int | None = None
    first_report: str | None = None  # the sanitizer's first error report, as printed
    seconds: float = 0.0


class StochasticCheck(BaseModel):
    """How a task whose reference draws random numbers was judged (`cuda_agent.judge.stochastic`)."""

    kind: str                   # "eval": eval() switches the random part off; "always": it does not
    eval_calls: int = 0         # calls checked exactly in eval mode (random part off), precision probe included
    draw_calls: int = 0         # calls checked statistically in training mode, against reference draws
    draws: int = 0              # reference draws per statistical call (the fewest, where memory cut them)
    # the closest call to its bound: Kolmogorov-Smirnov distance of the output's ranks among the
    # draws from uniform, and that call's bound (the reference's own draws, leave one out)
    worst_ks: float | None = None
    worst_ks_bound: float | None = None
    # per output, the spread test's z-scores summed over the training-mode calls and how many
    # (the run's z is z_sum / sqrt(z_calls); stochastic.Z_RUN bounds it)
    z_sum: list[float] = Field(default_factory=list)
    z_calls: list[int] = Field(default_factory=list)
    # per output, the rank test's KS distance over the draws' mean distance summed over the same
    # calls (the run's mean is ks_r_sum / z_calls; stochastic.run_ks_bound bounds it)
    ks_r_sum: list[float] = Field(default_factory=list)


class Verdict(BaseModel):
    """Everything the judge decided about one candidate on one task."""

    task_id: str
    task_name: str
    candidate_hash: str
    device: str                                  # "cuda" | "cpu"
    device_name: str = ""
    compiled: bool = False
    correct: bool = False
    policy_violations: list[str] = Field(default_factory=list)
    failure: Failure | None = None
    runtime: Timing | None = None
    eager: Timing | None = None
    compiled_ref: Timing | None = None
    compile_mode: str | None = None
    build_s: float | None = None
    build_cached: bool | None = None
    # per CUDA build, which header its .cu files were compiled with: "ops" or "light" (the judge's
    # stand-ins, JudgeConfig.op_cuda_headers / light_cuda_headers) or "torch" (torch's own)
    build_headers: list[str] = Field(default_factory=list)
    judge_s: float | None = None
    phase_s: dict[str, float] = Field(default_factory=dict)  # where the time went: build, baseline, start, calls (calls:* splits calls)
    max_abs_err: float | None = None
    max_rel_l2_err: float | None = None
    # Tolerance scaled to the reference's own noise (checked calls, float64 reference): the worst
    # error against float64, the reference's own worst error against it, and the tightest bound
    # applied. rel_l2_bound is the fixed per-dtype bound when the reference cannot run in float64.
    max_rel_l2_err_f64: float | None = None
    ref_noise_rel_l2: float | None = None
    rel_l2_bound: float | None = None
    n_checked: int = 0
    task_warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    isolation: list[str] = Field(default_factory=list)   # what isolation was in force
    # What was not isolated because the judge is not root (same uid, network and mounts as the
    # judge): documented reduced isolation. Missing isolation a root judge should have had fails
    # the verdict instead (failure category judge).
    reduced_isolation: list[str] = Field(default_factory=list)
    seeds: dict[str, int] = Field(default_factory=dict)  # revealed after the run, for reproduction
    calls: list[CallRecord] = Field(default_factory=list)
    versions: dict[str, str] = Field(default_factory=dict)
    # The task's least work and, on a GPU in the peaks table, the least time it can take there
    # (`cuda_agent.hardware.sol`); kept with the task's eager baseline.
    speed_of_light: SpeedOfLight | None = None
    from_cache: bool = False  # answered from the judge's verdict cache (`verdict_cache`): nothing ran
    memcheck: list[SanitizerRun] = Field(default_factory=list)  # JudgeConfig.memcheck: the sanitizer's runs
    stochastic: StochasticCheck | None = None  # the reference draws random numbers: how it was checked

    @property
    def runtime_ms(self) -> float | None:
        return self.runtime.median_ms if self.runtime else None

    @property
    def eager_ms(self) -> float | None:
        return self.eager.median_ms if self.eager else None

    @property
    def compile_ms(self) -> float | None:
        return self.compiled_ref.median_ms if self.compiled_ref else None

    @property
    def speedup_vs_eager(self) -> float | None:
        if self.correct and self.runtime_ms and self.eager_ms:
            return self.eager_ms / self.runtime_ms
        return None

    @property
    def speedup_vs_compile(self) -> float | None:
        if self.correct and self.runtime_ms and self.compile_ms:
            return self.compile_ms / self.runtime_ms
        return None

    @property
    def sol_ms(self) -> float | None:
        return self.speed_of_light.sol_ms if self.speed_of_light else None

    @property
    def sol_share(self) -> float | None:
        """The candidate's runtime as a share of speed-of-light (sol_ms / runtime_ms), correct candidates only."""
        return self.speed_of_light.share(self.runtime_ms) if self.correct and self.speed_of_light else None

    @property
    def floor_ms(self) -> float | None:
        return self.speed_of_light.floor_ms if self.speed_of_light else None

    @property
    def floor_share(self) -> float | None:
        """floor_ms / runtime_ms, whatever the verdict (over JudgeConfig.floor_margin fails it): how close the
        runtime came to the physical floor (hardware/sol.py)."""
        return self.speed_of_light.floor_share(self.runtime_ms) if self.speed_of_light else None

    @property
    def eager_sol_share(self) -> float | None:
        return self.speed_of_light.share(self.eager_ms) if self.speed_of_light else None

    @property
    def compile_sol_share(self) -> float | None:
        return self.speed_of_light.share(self.compile_ms) if self.speed_of_light else None

    def summary(self) -> dict:
        """The flat record of the measurements (`cuda-agent eval --json` adds the reward to it:
        `cuda_agent.reward.scored_summary`)."""
        return {
            "task": self.task_name,
            "task_id": self.task_id,
            "candidate_hash": self.candidate_hash,
            "device": self.device,
            "device_name": self.device_name,
            "compiled": self.compiled,
            "correct": self.correct,
            "policy_violations": list(self.policy_violations),
            "failure": self.failure.model_dump(mode="json") if self.failure else None,
            "runtime_ms": self.runtime_ms,
            "eager_ms": self.eager_ms,
            "compile_ms": self.compile_ms,
            "compile_mode": self.compile_mode,
            "speedup_vs_eager": self.speedup_vs_eager,
            "speedup_vs_compile": self.speedup_vs_compile,
            "sol_ms": self.sol_ms,
            "sol_share": self.sol_share,
            "eager_sol_share": self.eager_sol_share,
            "compile_sol_share": self.compile_sol_share,
            "sol_bound": self.speed_of_light.bound if self.speed_of_light else None,
            "sol_gpu": self.speed_of_light.gpu_model if self.speed_of_light else None,
            "sol_note": self.speed_of_light.reason if self.speed_of_light else None,
            "floor_ms": self.floor_ms,
            "floor_share": self.floor_share,
            "timing_source": self.runtime.source if self.runtime else None,
            "runtime_spread_ms": [self.runtime.p10_ms, self.runtime.p90_ms] if self.runtime else None,
            "max_abs_err": self.max_abs_err,
            "max_rel_l2_err": self.max_rel_l2_err,
            "max_rel_l2_err_f64": self.max_rel_l2_err_f64,
            "ref_noise_rel_l2": self.ref_noise_rel_l2,
            "rel_l2_bound": self.rel_l2_bound,
            "n_checked": self.n_checked,
            "stochastic": self.stochastic.model_dump(mode="json") if self.stochastic else None,
            "build_s": self.build_s,
            "build_cached": self.build_cached,
            "judge_s": self.judge_s,
            "from_cache": self.from_cache,
            "phase_s": dict(self.phase_s),
            "task_warnings": list(self.task_warnings),
            "notes": list(self.notes),
            "isolation": list(self.isolation),
            "reduced_isolation": list(self.reduced_isolation),
            "memcheck": [r.model_dump(mode="json") for r in self.memcheck],
        }
