"""What torch's headers cost nvcc in a load_inline CUDA file, and what the judge's two stand-ins
save: the light one (`JudgeConfig.light_cuda_headers`, `builds.LIGHT_EXTENSION_H`: torch/types.h
for torch/extension.h) and the op one (`JudgeConfig.op_cuda_headers`, `builds.ops_header`: for both
torch/types.h and torch/extension.h, only the ATen operators the file calls).

Each CUDA source is laid out as the judge lays out load_inline's `cuda.cu` (`build.inline_spec`;
a solution's load_inline calls are read by the judge's own build plan, `cuda_agent.judge.builds.plan_build`)
and compiled to an object only (no link, no GPU needed: a machine with nvcc and torch's headers
will do) with the nvcc line torch's extension builder writes for it, three times: as it is, with
the light stand-in and with the op stand-in ahead of torch's headers. Reported per file: the seconds of each
compile, nvcc's own split of them (`-time`: preprocessing, cudafe++ the host front end, cicc the
device front end, ptxas, the host compile), whether each compile succeeded, and what the judge's
build pays: its tries in order (op stand-in, light stand-in, torch's header) until one compiles.

    python benchmarks/cuda_header_cost.py [FILES.cu|solution.py ...] [--corpus .corpus --sample 8]
                                          [--arch 9.0] [--json out.json]

Without files or a corpus, one small kernel file of the usual published form is measured. With
`--corpus` (the KernelBench leaderboard's docs/assets, read at run time, never committed),
`--sample` solutions whose CUDA sources include torch/extension.h are drawn from raw_data.json.
Compiles run one at a time, so each has the machine's cores as they are (a loaded machine
stretches both figures alike).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SAMPLE_KERNEL = """#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto y = torch::empty_like(x);
    int n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""


def nvcc_line(folder: Path, arch: str) -> list[str]:
    """The nvcc command torch's extension builder writes for `folder/cuda.cu` (its ninja file)."""
    import os
    import shlex

    import torch.utils.cpp_extension as ce

    from cuda_agent.judge.builds.job import ninja_vars

    if ce.CUDA_HOME is None:   # a CPU build of torch: nvcc is still where CUDA_HOME or PATH says
        nvcc = subprocess.run(["which", "nvcc"], capture_output=True, text=True).stdout.strip()
        ce.CUDA_HOME = os.environ.get("CUDA_HOME") or (str(Path(nvcc).resolve().parent.parent) if nvcc else None)
        if ce.CUDA_HOME is None:
            raise SystemExit("nvcc not found (set CUDA_HOME)")
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    job = {"name": "header_cost", "sources": [str(folder / "cuda.cu")], "cflags": ["-O3"], "cuda_cflags": ["-O3"],
           "ldflags": [], "include": [str(folder)], "build_directory": str(folder), "with_cuda": True}
    var = ninja_vars(ce, job)
    return shlex.split(var["nvcc"]) + shlex.split(var["cuda_cflags"]) + shlex.split(var.get("cuda_post_cflags", ""))


def compile_once(folder: Path, line: list[str], light_dir: Path | None) -> dict:
    """One compile of folder/cuda.cu to an object: seconds, success, nvcc's phase split."""
    timing = folder / f"time-{'light' if light_dir else 'full'}.csv"
    timing.unlink(missing_ok=True)
    cmd = line + ([f"-I{light_dir}"] if light_dir else []) + [
        "-c", str(folder / "cuda.cu"), "-o", str(folder / "cuda.o"), "-time", str(timing)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    phases: dict[str, float] = {}
    if timing.exists():
        with timing.open() as fh:
            for row in csv.DictReader(fh, skipinitialspace=True):
                row = {k.strip(): (v or "").strip() for k, v in row.items() if k}
                name = row.get("phase name", "").split(" (")[0]
                try:
                    phases[name] = phases.get(name, 0.0) + float(row.get("metric", "0")) / 1000
                except ValueError:
                    continue
    error = "" if proc.returncode == 0 else next(
        (ln.strip() for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[-300:])[:300]
    return {"ok": proc.returncode == 0, "s": round(seconds, 2), "phases_s": {k: round(v, 2) for k, v in phases.items()},
            "error": error}


def cuda_file(text: str) -> str:
    """load_inline's cuda.cu for these CUDA sources, exactly as the judge writes it."""
    from cuda_agent.judge.builds import inline_spec

    spec = inline_spec(name="header_cost", cpp_sources=[], cuda_sources=[text], functions=None, cflags=[],
                       cuda_cflags=[], ldflags=[], with_cuda=True)
    return dict(spec.sources)["cuda.cu"]


def judge_cuda_files(code: str) -> list[str]:
    """The cuda.cu of each load_inline call the judge would build for this solution, as the judge
    reads the calls (`plan_build`: literal arguments only, lenient policy) and lays the file out."""
    from cuda_agent.candidate import Candidate
    from cuda_agent.judge.builds import plan_build

    plan = plan_build(Candidate.from_source(code), "cuda", "lenient")
    return [text for spec in plan.specs for rel, text in spec.sources if rel == "cuda.cu"]


def corpus_sources(corpus: Path, sample: int, seed: int) -> list[tuple[str, str]]:
    """(label, cuda.cu) of `sample` corpus solutions whose CUDA sources include torch/extension.h."""
    from cuda_agent.fidelity import corpus_root

    root = corpus_root(corpus)
    found = []
    for i, rec in enumerate(json.loads((root / "raw_data.json").read_text())):
        text = next((t for t in judge_cuda_files(rec.get("code", "")) if "torch/extension.h" in t), None)
        if text is not None:
            found.append((f"l{rec.get('level')}_p{rec.get('problem_id')}_{rec.get('model', i)}", text))
    random.Random(seed).shuffle(found)
    return found[:sample]


def file_sources(paths: list[Path]) -> list[tuple[str, str]]:
    """(label, cuda.cu) of each .cu file given and of each load_inline call of each solution given."""
    out = []
    for p in paths:
        text = p.read_text()
        if p.suffix == ".py":
            out += [(p.name, cu) for cu in judge_cuda_files(text)]
        else:
            out.append((p.name, cuda_file(text)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path, help=".cu files, or load_inline solutions (.py)")
    ap.add_argument("--corpus", type=Path, default=None, help="the leaderboard corpus (docs/assets or a checkout)")
    ap.add_argument("--sample", type=int, default=8, help="corpus solutions to measure")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", default="9.0", help="TORCH_CUDA_ARCH_LIST for the nvcc line (default 9.0, the H200's)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from cuda_agent.judge.builds import LIGHT_DIR, LIGHT_EXTENSION_H, OPS_DIR, OPS_HEADER, ops_header

    sources = file_sources(args.files) if args.files else []
    if args.corpus:
        sources += corpus_sources(args.corpus, args.sample, args.seed)
    if not args.files and not args.corpus:
        sources = [("sample_relu.cu", cuda_file(SAMPLE_KERNEL))]
    if not sources:
        print("no CUDA sources found", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="header-cost-") as tmp:
        folder = Path(tmp)
        light, ops = folder / LIGHT_DIR, folder / OPS_DIR
        (light / "torch").mkdir(parents=True)
        (light / "torch" / "extension.h").write_text(LIGHT_EXTENSION_H)
        (ops / "torch").mkdir(parents=True)
        for name in ("types.h", "extension.h"):
            (ops / "torch" / name).write_text(f'#include "{OPS_HEADER}"\n')
        line = nvcc_line(folder, args.arch)
        for label, text in sources:
            (folder / "cuda.cu").write_text(text)
            (ops / "torch" / OPS_HEADER).write_text(ops_header([text]))
            row = {"source": label, "full": compile_once(folder, line, None), "light": compile_once(folder, line, light),
                   "ops": compile_once(folder, line, ops)}
            # what the judge's build pays: its tries in order until one compiles (Builder._header_tiers)
            tries = ["ops"] + (["light"] if "torch/extension.h" in text else []) + ["full"]
            first = next((t for t in tries if row[t]["ok"]), "full")
            row["judge_s"] = round(sum(row[t]["s"] for t in tries[:tries.index(first) + 1]), 2)
            row["judge_header"] = first
            rows.append(row)
            full = row["full"]
            print(f"{label}: torch's header {full['s']:.1f} s ({'ok' if full['ok'] else 'fails'}), "
                  + ", ".join(f"{k} stand-in {row[k]['s']:.1f} s ("
                              + (f"{full['s'] / row[k]['s']:.2f}x" if row[k]["ok"] else "fails: " + row[k]["error"][:100])
                              + ")" for k in ("light", "ops"))
                  + f"; the judge's build {row['judge_s']:.1f} s with {first}", flush=True)
    every = [r for r in rows if all(r[k]["ok"] for k in ("full", "light", "ops"))]

    def median(values):
        values = list(values)
        return round(statistics.median(values), 3) if values else None

    summary = {
        "sources": len(rows), **{f"{k}_ok": sum(r[k]["ok"] for r in rows) for k in ("full", "light", "ops")},
        **{f"median_{k}_s": median(r[k]["s"] for r in every) for k in ("full", "light", "ops")},
        "median_full_over_light": median(r["full"]["s"] / r["light"]["s"] for r in every),
        "median_light_over_ops": median(r["light"]["s"] / r["ops"]["s"] for r in every),
        # what a build costs with the judge's tries and their fallbacks, against torch's header alone
        "total_full_s": round(sum(r["full"]["s"] for r in rows), 1),
        "total_judge_s": round(sum(r["judge_s"] for r in rows), 1),
        "judge_headers": {k: sum(r["judge_header"] == k for r in rows) for k in ("ops", "light", "full")},
    }
    for kind in ("full", "light", "ops"):
        phases: dict[str, float] = {}
        for r in every:
            for k, v in r[kind]["phases_s"].items():
                phases[k] = phases.get(k, 0.0) + v
        summary[f"{kind}_phases_s"] = {k: round(v, 1) for k, v in sorted(phases.items(), key=lambda kv: -kv[1])}
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
