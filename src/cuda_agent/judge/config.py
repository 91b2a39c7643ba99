"""One typed config for the judge. Every field is documented; CLI flags override file values.

Nothing here scores: the reward has its own config (`cuda_agent.reward.RewardConfig`), so judge
settings describe only what a verdict measures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator




def default_cache_dir() -> Path:
    base = os.environ.get("CUDA_AGENT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cuda_agent")
    return Path(base)


def default_work_root() -> Path:
    """Where the judge's working folder is (CUDA_AGENT_WORK, or one per user under /var/tmp), without
    making it (`sandbox.work_root_dir` makes it)."""
    return Path(os.environ.get("CUDA_AGENT_WORK", f"/var/tmp/cuda-agent-{os.geteuid()}"))


def default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # torch missing or broken: the CPU backend still names a device
        return "cpu"


def device_memory_mb(device: str) -> int:
    """Total memory of the judge's device: the current GPU's on cuda, the host's on cpu (0 if unknown)."""
    try:
        if device == "cuda":
            import torch

            return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory >> 20
        return (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) >> 20
    except Exception:  # no device to ask: the floor of output_limit_mb applies
        return 0


class JudgeConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    device: Literal["cuda", "cpu"] = Field(default_factory=default_device,
                                           description="backend: CUDA kernels on the GPU or C++ on the CPU")
    policy: Literal["strict", "lenient"] = Field(
        "strict", description="strict = the CUDA Agent skill (no PyTorch compute in forward); "
                              "lenient = torch glue allowed, only tampering is refused")
    atol: float = Field(1e-2, description="elementwise absolute tolerance (CUDA Agent default)")
    rtol: float = Field(1e-2, description="elementwise relative tolerance (CUDA Agent default)")
    max_rel_l2: dict[str, float] = Field(
        default_factory=lambda: {"float64": 1e-6, "float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2},
        description="bound on ||out-ref||/||ref|| per output dtype: catches lower-precision compute "
                    "and outputs so small that atol alone would accept zeros. Where the reference also runs "
                    "in float64 (checked calls), the floor of the noise-scaled bound (see ref_noise_multiple)")
    ref_noise_multiple: float = Field(
        16.0, ge=0, description="on checked calls the reference also runs in float64; the candidate's "
                                "relative L2 error against that may be this many times the fp32 reference's own "
                                "(never below max_rel_l2, never above max_rel_l2_ceiling plus 6x that error). "
                                "Measured: fp32 reorderings 0.5-9x, fp16/TF32 operands ~1000x, bf16 ~8000x. 0: fixed bound "
                                "against the reference only, no float64 evaluation")
    max_rel_l2_ceiling: float = Field(
        1e-2, gt=0, description="how far a noisy (ill-conditioned) reference can widen the relative L2 bound: "
                                "to this plus 6x the reference's own error (another correct order of float32 "
                                "arithmetic can be several times as far from float64 as the reference's); far "
                                "below what zero (1.0) or constant outputs give")
    # 5e-4: above the tanh approximation of GELU (2e-4 over standard-normal inputs) with room for the
    # layers around it, below the ~1e-3 of a wrong but smooth computation (eval-mode BatchNorm where
    # the task trains). Whatever passes through it must still pass the precision probe.
    approx_rel_l2: float = Field(
        5e-4, ge=0, description="relative L2 error against float64 up to which an output over the noise-scaled bound "
                                "still passes if the candidate computes at the task's precision: an approximation "
                                "(tanh GELU for erf GELU) rather than lower-precision arithmetic, which can err as "
                                "much. The precision probe tells them apart: the checked call is repeated with its inputs "
                                "and the parameters copied from Model moved by 2^-8 relative, and the change of the "
                                "output must agree with float64's "
                                "(fp16 or TF32 rounding leaves a change that small unresolved); then every warm-up "
                                "and timed call comes in such a pair. 0: off")
    n_check: int = Field(5, ge=1, description="input sets used for the correctness verdict")
    n_warmup: int = Field(3, ge=0, description="warm-up calls (fresh inputs, outputs checked too)")
    n_timed: int = Field(20, ge=3, description="timed calls, each with fresh inputs, each output checked")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "none"] = Field(
        "default", description="torch.compile mode of the compiled baseline; 'none' skips it")
    flush_l2: bool = Field(True, description="overwrite the cache between calls so every call starts cold")
    flush_after_inputs: Literal["auto", "on", "off"] = Field(
        "auto", description="CUDA, with flush_l2: flush again once a call's inputs are written (before its clock "
                            "in the process starts), so their last lines are not left dirty in the L2 as "
                            "Nsight Compute's flush never leaves them: the judge writes the inputs after the "
                            "untimed flush, and a memory-bound kernel then pays to write those lines back "
                            "(inputs over the L2's size; 128 MB in: 7% over Nsight Compute without the flush, "
                            "2% with it, on the H200) or reads them from the L2 (smaller ones). 'auto': only "
                            "for calls whose inputs exceed the L2's size (a 16 MB input kept in it reads 3-5% "
                            "under Nsight Compute, flushed 11% over: the gate's markers add ~2 us to a kernel "
                            "that Nsight Compute times alone). Costs one read of twice the L2 per call on the "
                            "judge's clock, which the null baseline includes. Not with the judge's release, "
                            "whose inputs arrive after the call has started. true/false mean on/off")
    touch_pages: bool = Field(
        False, description="CUDA, with the process's release: once a call's inputs are written, read one byte "
                            "in every 2 MiB of them and of the memory its outputs will take, before the clock "
                            "in the process starts, so the call does not start with the GPU's address "
                            "translations evicted by the judge's own work between calls (a profiler's replay "
                            "finds them warm). Puts one cache line per page into the L2")
    stage_inputs: bool = Field(
        True, description="CUDA, GPU region, with the process's release: once the judge has written a call's "
                          "inputs, the process copies them into its own GPU memory (untimed, before the call's "
                          "clock starts on either side) and the call reads that copy; after the clock, the copy "
                          "goes back for the judge's check of the inputs. On an H200 a kernel streams memory mapped "
                          "from the judge's process (CUDA IPC) ~20% slower than the process's own (1 GB y = 2x: "
                          "0.645 against 0.523 ms, timing_check.py --bandwidth-probe), a cost Nsight Compute's "
                          "run never pays. Costs the process a block of one call's inputs' size and two "
                          "untimed device copies per call. The judge's release (the second round) still reads "
                          "the region")
    keep_gpu_plane: bool = Field(
        False, description="CUDA: keep the GPU region shared with candidate processes (their calls' inputs and "
                           "outputs) from one process to the next, zeroed in between, instead of freeing it "
                           "after each and allocating the next: GPU memory that a live process frees slows a "
                           "memory-bound kernel in another process for a while after (judge_replica in "
                           "docs/results/2026-12-06-retired-diagnostics.md, frees: a 1 GB elementwise kernel 0.54 -> 0.60 ms), "
                           "and every baseline and candidate process the judge starts follows such a free "
                           "(measured in the judge on an H200: no effect, the 1 GB kernel 0.640-0.646 ms either "
                           "way; its slowness was the region's IPC mapping, see stage_inputs). "
                           "Grown (freed, then allocated larger) when a task needs more; held while the judge lives")
    poison_outputs: bool = Field(
        True, description="CUDA: before each call, fill a block of the outputs' size with NaN bytes and free it, so "
                          "the outputs land in it and elements the candidate never writes show as NaN instead of "
                          "as a previous call's correct values. Off only to measure what the poisoning costs")
    gate_release: Literal["process", "judge"] = Field(
        "process", description="CUDA, GPU region: who opens a timed call's gate. 'process': the candidate's "
                               "process, once forward has enqueued its work; the judge's clock then spans the "
                               "enqueueing too. 'judge': the judge writes the call's inputs and opens the gate "
                               "when the process says forward has enqueued, so its clock of the call starts "
                               "where the GPU's work can start (launch-bound forwards and a loaded host no "
                               "longer stretch it). With 'process', a round whose claims the judge's clock "
                               "disagrees with is followed by one with 'judge' (in a fresh process); 'judge' "
                               "for every call costs ~10 us kernels 3-30 us on an H200")
    release_writes: Literal["device", "host"] = Field(
        "device", description="with the judge's release (gate_release, or the second round after a "
                              "disagreement), how the judge writes a call's inputs into the GPU region at the "
                              "release: 'device' copies them from its GPU memory (work of the judge's CUDA "
                              "context while the candidate's gate holds the GPU; on the H200 a ~10 us kernel "
                              "then read 3-30 us slower), 'host' from page-locked host memory staged before "
                              "the call (the copy engines; slower to write, before the judge's clock starts)")
    device_lock: Path | None = Field(
        None, description="lock file shared by the judges of one device (judge/devlock.py): each timed call "
                          "holds it alone, every other call shares it, so several judges can check candidates "
                          "on one GPU while timed calls run by themselves. None: on CUDA, the lock of the GPU "
                          "the process sees first (devlock.gpu_lock_of(0)), which every judge of the machine on "
                          "that GPU takes; on the CPU backend, none (the pool sets the host's)")
    timing_rel_slack: float | None = Field(
        None, description="outside clock may exceed the claimed time by this fraction "
                          "(default 0.25; on cpu the outside clock is CPU time)")
    timing_abs_slack_ms: float | None = Field(
        None, description="... plus this many ms before the claim is disbelieved (default 0.2 cuda, 0.3 cpu)")

    def slack(self) -> tuple[float, float]:
        rel = self.timing_rel_slack if self.timing_rel_slack is not None else (0.25 if self.device == "cuda" else 0.25)
        abs_ms = self.timing_abs_slack_ms if self.timing_abs_slack_ms is not None else (
            0.2 if self.device == "cuda" else 0.3)
        return rel, abs_ms
    floor_margin: float = Field(
        1.25, ge=0, description="CUDA: a candidate whose runtime beats the task's physical floor (bytes it must move "
                                "through DRAM beyond the L2's size, at the datasheet's peak: hardware/sol.py) by "
                                "more than this factor fails with the timing category. Room for what the floor does "
                                "not model (compressible memory, inputs whose contribution is below tolerance, the "
                                "event clock's resolution); honest kernels measure at most ~0.9 of the floor "
                                "(measured copy bandwidth over the datasheet's). 0: no check")
    memcheck: bool = Field(
        False, description="CUDA: after the calls pass, run one checked call of the candidate under NVIDIA "
                           "compute-sanitizer (memcheck, and racecheck where its sources use shared memory) in its "
                           "own sandboxed process; any error fails it with the runtime category and the "
                           "sanitizer's first report (judge/memcheck.py). Costs a process start and one call "
                           "10-100x slower than usual")
    build_timeout_s: float = Field(300.0, description="limit on one build")
    light_cuda_headers: bool = Field(
        True, description="build a .cu that includes <torch/extension.h> first with a stand-in of the judge's "
                           "(<torch/types.h>: no C++ frontend modules, no pybind11), which nvcc's front ends parse "
                           "in about a third of the time; a file that needs more is built again with torch's own "
                           "header, whose errors are the ones reported")
    op_cuda_headers: bool = Field(
        True, description="before that, build such a .cu (and load_inline's own cuda.cu, which includes "
                          "<torch/types.h>) with a stand-in for both headers that declares the tensor class, "
                          "its options, dispatch macros and checks, and of ATen's operators only those the "
                          "sources call (ATen's per-operator headers: every overload of each name); about "
                          "30% less nvcc time again. A file that needs more is built with the next header")
    init_timeout_s: float = Field(120.0, description="limit on loading the candidate and constructing ModelNew")
    call_timeout_s: float = Field(30.0, description="limit on one forward call")
    total_timeout_s: float = Field(900.0, description="limit on judging one candidate")
    memory_limit_mb: int = Field(16384, description="host memory of the candidate process (RSS watchdog)")
    disk_limit_mb: int = Field(4096, description="disk space the candidate process may consume (watchdog)")
    max_output_mb: int | None = Field(
        None, ge=1, description="largest total output of one call, in MiB (default: an eighth of the GPU's "
                                "memory on cuda, of the host's on cpu, and at least 2048)")

    def output_limit_mb(self) -> int:
        """The output limit in force: the configured cap, else a share of the device's memory. The
        judge holds the reference output, the candidate its own and the transport a third copy, so
        an eighth leaves room for all of them and for the models themselves."""
        if self.max_output_mb is not None:
            return self.max_output_mb
        return max(2048, device_memory_mb(self.device) // 8)
    cache_dir: Path = Field(default_factory=default_cache_dir,
                            description="builds, compiled extensions and cached baselines")
    cache_baselines: bool = Field(True, description="reuse eager/compile baseline timings per task and machine")
    verdict_cache: bool = Field(
        False, description="answer a candidate judged before (same task, bytes, deciding settings, machine model, "
                           "software and judge code) from the stored verdict, marked from_cache; only correct "
                           "verdicts and load, policy and compile failures are stored")
    use_zygote: bool | None = Field(
        None, description="fork candidate processes from a process that has imported torch once (start in "
                          "milliseconds, not seconds); default: on for the cpu backend, off for cuda")
    build_zygote: bool | None = Field(
        None, description="fork build jobs from a process that has imported torch and its extension builder once "
                          "(saves each build the interpreter's start, ~2 s); default: on, off where use_zygote is "
                          "set to false. Build jobs never initialise CUDA, so this is on for cuda too, where "
                          "workers start fresh")
    spares: int = Field(2, ge=0, le=8, description=(
        "cuda backend: worker processes started ahead of need (torch imported, GPU context and profiler "
        "ready, ~10 s each); each holds a GPU context while it waits. Back-to-back evaluations shorter "
        "than a tenth of that start time wait for one; 0 starts each worker when its candidate comes"))
    sandbox_uid: int | None = Field(None, ge=1, description="uid for untrusted processes when run as root (default: "
                                                      "one of cuda_agent.host.JUDGE_UIDS per judge; its spare "
                                                      "workers and builds are offset from it there)")
    landlock: Literal["auto", "on", "off"] = Field(
        "auto", description="Landlock confinement of candidate and compiler processes (reads anywhere but the "
                            "judge's folders, writes only in their own folder and to device nodes): auto = on the "
                            "CPU backend where the judge is not root and the kernel offers it (as root the uid drop "
                            "and private mounts already isolate; on CUDA not until the GPU tier has run it); on = "
                            "always, and a kernel without it is an error; off = never")

    @field_validator("flush_after_inputs", mode="before")
    @classmethod
    def _flush_switch(cls, value):
        # true/false: the switch it was before 'auto' existed
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    def landlock_mode(self) -> str:
        """`landlock` as the sandbox takes it (sandbox.landlock_use): "auto" is "off" on CUDA, where
        the driver's use of the file system under Landlock (/dev/shm stays read-only) is untested."""
        return "off" if self.landlock == "auto" and self.device == "cuda" else self.landlock
    arch: str | None = Field(None, description="CUDA arch list for builds, e.g. '9.0' (default: the device's)")
    timing_cpus: list[int] | None = Field(
        None, description="cores the judge and the candidate process it is timing run on, kept free of other "
                          "work (the pool reserves two per GPU when the machine has cores to spare); None: "
                          "wherever the scheduler puts them")
    spare_cpus: list[int] | None = Field(
        None, description="cores spare workers start on while they wait for a task (with timing_cpus: so their "
                          "start-up does not load the cores of the call being timed)")
