"""Does the judge time honest kernels as Nsight Compute does, alone and on a busy host?

Two honest CUDA Agent workspaces (a vectorised elementwise kernel and a shared-memory tiled SGEMM,
plain CUDA files with the tensor checks in their bindings) are judged at sizes whose kernels take
from about 10 us to about 100 ms:

1. alone: nothing else runs on the machine;
2. loaded: every core the pool would give its compile workers runs a busy process at the compile
   workers' priority (the judge keeps the two cores the pool reserves for it);
3. loaded-all (`--load-all`): every core busy, the judge's own included, at normal priority;
4. Nsight Compute (`ncu` on PATH): the same library, run by a trusted script, L2 flushed before each
   call, clocks left as they are; the runtime is the summed `gpu__time_duration` of a forward.

It prints, per size, the judge's runtime in each condition, how it was timed (`gated`: behind the
timing gate, GPU work only), and the ratio to Nsight Compute; with `nvidia-smi`, also the GPU's SM
clock, power and temperature while each was measured (in the JSON: a long compute-bound kernel
timed back to back can run at lower clocks than one replayed under Nsight Compute), and the
timed calls' median time between their start and end markers, with how many were timed longer
because the device looked busy past the end marker, and the checked calls' kernel time in CUDA's
activity records (as Nsight Compute reads it, in the judge's own candidate process). Targets: within 5% of Nsight Compute
from 10 us, within 2% from 1 ms, loaded as alone. `--cases ewt-32M ewt-256M`: the elementwise task
with a plain-PyTorch ModelNew, judged and profiled the same way (see CASES).

    python benchmarks/timing_check.py [--out DIR] [--sizes small|all | --cases CASE ...] [--load-all] [--no-ncu]
                                       [--gate-release process|judge|both] [--bandwidth-probe] [-c KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from cuda_agent.measure.gpu import GpuClocks, markers, ncu_ms_per_forward  # noqa: E402

EW_CU = r"""
#include <cuda_runtime.h>
#include <cstdint>
__global__ void scale_shift_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 v = x[i];
        y[i] = make_float4(v.x * 2.0f + 1.0f, v.y * 2.0f + 1.0f, v.z * 2.0f + 1.0f, v.w * 2.0f + 1.0f);
    }
}
cudaError_t scale_shift_launch(const float* x, float* y, int64_t n, cudaStream_t stream) {
    int64_t n4 = n / 4;
    int blocks = (int)((n4 + 255) / 256 < 132 * 16 ? (n4 + 255) / 256 : 132 * 16);
    scale_shift_kernel<<<blocks, 256, 0, stream>>>((const float4*)x, (float4*)y, n4);
    return cudaGetLastError();
}
"""
EW_BINDING = r"""
#include "binding_registry.h"
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
cudaError_t scale_shift_launch(const float* x, float* y, int64_t n, cudaStream_t stream);
torch::Tensor scale_shift_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.dtype() == torch::kFloat32 && x.is_contiguous() && x.numel() % 4 == 0,
                "scale_shift_forward: contiguous float32 CUDA tensor with a multiple of 4 elements");
    auto y = torch::empty_like(x);
    cudaError_t err = scale_shift_launch(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(),
                                         c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == cudaSuccess, "scale_shift_forward: ", cudaGetErrorString(err));
    return y;
}
REGISTER_BINDING(scale_shift, [](pybind11::module_& m) { m.def("scale_shift_forward", &scale_shift_forward); });
"""
MM_CU = r"""
#include <cuda_runtime.h>
#define TILE 32
__global__ void sgemm_tiled(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int n) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < n; t += TILE) {
        As[threadIdx.y][threadIdx.x] = (row < n && t + threadIdx.x < n) ? A[row * n + t + threadIdx.x] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (col < n && t + threadIdx.y < n) ? B[(t + threadIdx.y) * n + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < n && col < n) C[row * n + col] = acc;
}
cudaError_t sgemm_launch(const float* a, const float* b, float* c, int n, cudaStream_t stream) {
    dim3 block(TILE, TILE), grid((n + TILE - 1) / TILE, (n + TILE - 1) / TILE);
    sgemm_tiled<<<grid, block, 0, stream>>>(a, b, c, n);
    return cudaGetLastError();
}
"""
MM_BINDING = r"""
#include "binding_registry.h"
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
cudaError_t sgemm_launch(const float* a, const float* b, float* c, int n, cudaStream_t stream);
torch::Tensor sgemm_forward(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda() && a.dtype() == torch::kFloat32 && b.dtype() == torch::kFloat32,
                "sgemm_forward: float32 CUDA tensors");
    TORCH_CHECK(a.dim() == 2 && a.sizes() == b.sizes() && a.size(0) == a.size(1), "sgemm_forward: square matrices");
    auto ac = a.contiguous(), bc = b.contiguous();
    auto c = torch::empty_like(ac);
    cudaError_t err = sgemm_launch(ac.data_ptr<float>(), bc.data_ptr<float>(), c.data_ptr<float>(), (int)a.size(0),
                                   c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == cudaSuccess, "sgemm_forward: ", cudaGetErrorString(err));
    return c;
}
REGISTER_BINDING(sgemm, [](pybind11::module_& m) { m.def("sgemm_forward", &sgemm_forward); });
"""
EW_MODEL_NEW = """import torch.nn as nn
import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x):
        return cuda_extension.scale_shift_forward(x)
"""
MM_MODEL_NEW = """import torch.nn as nn
import cuda_extension


class ModelNew(nn.Module):
    def forward(self, a, b):
        return cuda_extension.sgemm_forward(a, b)
"""


def ew_task(n: int) -> str:
    return textwrap.dedent(f'''\
        """y = 2x + 1 over {n} floats."""
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def forward(self, x):
                return x * 2.0 + 1.0


        def get_inputs():
            return [torch.randn({n})]


        def get_init_inputs():
            return []
        ''')


def mm_task(n: int) -> str:
    return textwrap.dedent(f'''\
        """C = A @ B, {n}x{n} float32."""
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def forward(self, a, b):
                return torch.matmul(a, b)


        def get_inputs():
            return [torch.randn({n}, {n}), torch.randn({n}, {n})]


        def get_init_inputs():
            return []
        ''')


# (label, kind, size): the elementwise kernels move 32 MB to 2 GB (~10 us to ~0.6 ms), the SGEMMs
# run from ~2 to ~120 ms. `ewt`: the same task with a ModelNew of plain PyTorch (`x * 2.0 + 1.0`,
# the eager baseline's own two kernels) judged as a candidate under the lenient policy, only when
# named in --cases: whether PyTorch's kernels lose the same share to Nsight Compute in the judge's
# candidate process as the workspace's kernel does.
CASES = [("ew-4M", "ew", 1 << 22), ("ew-32M", "ew", 1 << 25), ("ew-256M", "ew", 1 << 28),
         ("mm-1024", "mm", 1024), ("mm-2048", "mm", 2048), ("mm-4096", "mm", 4096), ("mm-8192", "mm", 8192),
         ("ewt-32M", "ewt", 1 << 25), ("ewt-256M", "ewt", 1 << 28)]
SMALL = {"ew-4M", "ew-32M", "mm-2048"}
EWT_MODEL_NEW = """import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0
"""


def workspace(folder: Path, kind: str) -> Path:
    """The candidate of `kind`: a workspace folder, or for `ewt` a single ModelNew file."""
    if kind == "ewt":
        path = folder / "ewt_model_new.py"
        path.write_text(EWT_MODEL_NEW)
        return path
    ws = folder / f"ws-{kind}"
    (ws / "kernels").mkdir(parents=True, exist_ok=True)
    cu, binding, model_new = (EW_CU, EW_BINDING, EW_MODEL_NEW) if kind == "ew" else (MM_CU, MM_BINDING, MM_MODEL_NEW)
    name = "scale_shift" if kind == "ew" else "sgemm"
    (ws / "kernels" / f"{name}.cu").write_text(cu)
    (ws / "kernels" / f"{name}_binding.cpp").write_text(binding)
    (ws / "model_new.py").write_text(model_new)
    return ws


def _spin(nice: int) -> None:
    os.nice(nice)
    while True:
        pass


def start_load(cpus: list[int], nice: int) -> list[multiprocessing.Process]:
    ctx = multiprocessing.get_context("fork")
    procs = []
    for c in cpus:
        p = ctx.Process(target=_spin, args=(nice,), daemon=True)
        p.start()
        os.sched_setaffinity(p.pid, [c])
        procs.append(p)
    return procs


def stop_load(procs) -> None:
    for p in procs:
        p.kill()
        p.join()


NCU_RUNNER = r"""
import importlib.util, sys, types, torch
lib, model_new, task, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if lib != "-":  # a candidate without a library of its own (plain PyTorch): "-"
    spec = importlib.util.spec_from_file_location("cuda_extension", lib)
    ext = importlib.util.module_from_spec(spec); spec.loader.exec_module(ext); sys.modules["cuda_extension"] = ext
ref = types.ModuleType("model"); exec(open(task).read(), ref.__dict__)
mod = types.ModuleType("model_new"); exec(open(model_new).read(), mod.__dict__)
model = mod.ModelNew(*ref.get_init_inputs()).cuda()
with torch.device("cuda"):
    inputs = [ref.get_inputs() for _ in range(calls + 1)]
with torch.no_grad():
    model(*inputs[0]); torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for x in inputs[1:]:
        model(*x)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
"""


def ncu_ms(lib: Path | None, model_new: Path, task_file: Path, calls: int = 5) -> float | None:
    """Summed gpu__time_duration of the profiled forwards, per forward (ms). `lib` None: the
    candidate runs PyTorch only."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return None
    runner = task_file.parent / "ncu_runner.py"
    runner.write_text(NCU_RUNNER)
    cmd = [ncu, "--csv", "--metrics", "gpu__time_duration.sum", "--profile-from-start", "off",
           "--cache-control", "all", "--clock-control", "none", sys.executable, str(runner),
           str(lib) if lib is not None else "-", str(model_new), str(task_file), str(calls)]
    from cuda_agent.judge.devlock import counters_lock

    with counters_lock().hold(exclusive=True):  # one ncu per GPU
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return ncu_ms_per_forward(out.stdout, calls)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/timing_check"))
    ap.add_argument("--sizes", choices=("small", "all"), default="all")
    ap.add_argument("--load-all", action="store_true", help="also time with every core busy, the judge's too")
    ap.add_argument("--cases", nargs="+", choices=[c[0] for c in CASES], metavar="CASE",
                    help=f"only these cases (instead of --sizes): {', '.join(c[0] for c in CASES)}")
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument("--bandwidth-probe", action="store_true",
                    help="after each evaluation's calls, time y = 2x on its largest input in the candidate process "
                         "and in the judge's, reading the shared region and a copy in the process's own memory "
                         "(timing.bandwidth_probe; printed and kept in the verdict's notes)")
    ap.add_argument("--gate-release", default="process",
                    help="who opens a timed call's gate (JudgeConfig.gate_release): process, judge, or "
                         "both (every condition twice; the judge's columns are suffixed '/judge')")
    ap.add_argument("-c", "--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a JudgeConfig field in every condition, e.g. -c release_writes=host")
    args = ap.parse_args()
    if args.bandwidth_probe:
        os.environ["CUDA_AGENT_BANDWIDTH_PROBE"] = "1"  # read by the judge in this process (harness.py)
    if args.gate_release not in ("process", "judge", "both"):
        ap.error("--gate-release: process, judge or both")

    import torch

    from cuda_agent.candidate import Candidate
    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.judge.builds import workspace_spec
    from cuda_agent.settings import SettingsError, apply_overrides
    from cuda_agent.tasks import load_task_file
    from cuda_agent.reward import reward_of

    try:
        overrides = apply_overrides({}, args.set, JudgeConfig)
    except SettingsError as exc:
        ap.error(str(exc))

    if not torch.cuda.is_available():
        print("timing_check needs a CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="timing-check-"))
    allowed = sorted(os.sched_getaffinity(0))
    # what the pool does on this machine: two cores for the judge, the rest for compile workers
    timing_cpus, rest = (allowed[:2], allowed[2:]) if len(allowed) >= 4 else (None, allowed)
    cases = [c for c in CASES if (c[0] in args.cases if args.cases else
                                  (args.sizes == "all" and c[1] != "ewt") or c[0] in SMALL)]
    # A plain-PyTorch candidate needs the lenient policy; the policy does not change how a call is
    # timed, so then every case is judged under it.
    policy = "lenient" if any(k == "ewt" for _, k, _ in cases) else "strict"
    loads = ["alone", "loaded"] + (["loaded-all"] if args.load_all else [])
    releases = ["process", "judge"] if args.gate_release == "both" else [args.gate_release]
    # (column, load, gate_release): the process's release keeps the plain names
    plan = [(load if rel == "process" else f"{load}/judge", load, rel) for rel in releases for load in loads]
    conditions = [col for col, _, _ in plan]
    rows: dict[str, dict] = {label: {"label": label} for label, _, _ in cases}
    wss = {kind: workspace(tmp, kind) for kind in {k for _, k, _ in cases}}
    tasks = {}
    for label, kind, n in cases:
        f = tmp / f"task_{label}.py"
        f.write_text(mm_task(n) if kind == "mm" else ew_task(n))
        tasks[label] = f
    for cond, how, release in plan:
        cfg = JudgeConfig.model_validate({
            **overrides, "device": "cuda", "compile_mode": "none", "policy": policy, "gate_release": release,
            "timing_cpus": timing_cpus if how != "loaded-all" else None,
            "spare_cpus": rest if how != "loaded-all" else None})
        load = []
        if how == "loaded":
            load = start_load(rest, 10)
        elif how == "loaded-all":
            load = start_load(allowed, 0)
        try:
            with Judge(cfg) as judge:
                for label, kind, _ in cases:
                    with GpuClocks() as clocks:
                        v = judge.evaluate(load_task_file(tasks[label]), Candidate.from_path(wss[kind]))
                    row = rows[label]
                    row[cond] = {"correct": v.correct, "reward": reward_of(v).value,
                                 "runtime_ms": v.runtime.median_ms if v.runtime else None,
                                 "min_ms": v.runtime.min_ms if v.runtime else None,
                                 "source": v.runtime.source if v.runtime else None, "gpu": clocks.summary(),
                                 # any process's GPU memory allocated or freed while the calls ran
                                 "calls_memory": clocks.memory_changes(v.phase_s.get("calls") or 0.0),
                                 **markers(v.calls),
                                 "notes": v.notes, "failure": v.failure.message[:300] if v.failure else None,
                                 "eager_ms": v.eager_ms}
                    for note in v.notes:
                        if note.startswith("bandwidth probe"):
                            print(f"{cond:10s} {label:9s} {note}", flush=True)
                    print(f"{cond:10s} {label:9s} {row[cond]['runtime_ms']} ms ({row[cond]['source']}) "
                          f"eager={v.eager_ms} correct={v.correct} markers={markers(v.calls)} gpu={clocks.summary()} "
                          f"calls_memory={row[cond]['calls_memory']} "
                          f"{'; '.join(v.notes)[:200]}", flush=True)
                    if cond == "alone" and not args.no_ncu:
                        lib = None
                        if kind != "ewt":
                            spec = workspace_spec(Candidate.from_path(wss[kind]).kernels, f"ws:timing-{kind}", "cuda")
                            lib = judge.builder.build(spec).library
                        model_new = wss[kind] if kind == "ewt" else wss[kind] / "model_new.py"
                        with GpuClocks() as clocks:
                            row["ncu_ms"] = ncu_ms(lib, model_new, tasks[label])
                        row["ncu_gpu"] = clocks.summary()
                        print(f"{'ncu':10s} {label:9s} {row['ncu_ms']} ms gpu={row['ncu_gpu']}", flush=True)
        finally:
            stop_load(load)
    lines = ["| case | ncu ms | " + " | ".join(f"{c} ms (how) | {c}/ncu" for c in conditions) + " |",
             "|---|---|" + "---|---|" * len(conditions)]
    for row in rows.values():
        cells = [row["label"], f"{row['ncu_ms']:.4f}" if row.get("ncu_ms") else "-"]
        for c in conditions:
            r = row.get(c) or {}
            ms = r.get("runtime_ms")
            cells.append(f"{ms:.4f} ({r.get('source')})" if ms else f"failed: {r.get('failure')}")
            cells.append(f"{ms / row['ncu_ms']:.3f}" if ms and row.get("ncu_ms") else "-")
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    (args.out / "timing_check.md").write_text(table + "\n")
    (args.out / "timing_check.json").write_text(json.dumps({
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cores": len(allowed),
        "timing_cpus": timing_cpus, "overrides": overrides, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rows": list(rows.values())}, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
