"""What a build job's start costs: consecutive builds of a small new C++ extension, each build job
forked from the builds' zygote (`JudgeConfig.build_zygote`) or started as a fresh interpreter.

Each build is a new source (a cache miss) in the judge's own builder, one after another as a
judge's cold steps come; the first build from a zygote also waits for the zygote's imports.

    python benchmarks/build_start.py [--builds 3] [--device cpu|cuda] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path


def run(zygote_on: bool, builds: int, device: str, cache: Path) -> list[float]:
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.judge.build import Builder, build_arch, inline_spec
    from cuda_agent.judge.sandbox import work_root_dir
    from cuda_agent.judge.supply import ZygoteHolder

    cfg = JudgeConfig(device=device, build_zygote=zygote_on, cache_dir=cache, build_timeout_s=600)
    holder = ZygoteHolder(cfg, builds=True)
    builder = Builder.for_config(cfg, work_root_dir(), arch=build_arch(device, None), uid=None, zygote=holder)
    seconds = []
    try:
        for i in range(builds):
            spec = inline_spec(name="build_start", cpp_sources=[f"// {uuid.uuid4().hex}\nint f() {{ return {i}; }}"],
                               cuda_sources=[], functions=None, cflags=[], cuda_cflags=[], ldflags=[],
                               with_cuda=False)
            t0 = time.monotonic()
            builder.build(spec)
            seconds.append(round(time.monotonic() - t0, 2))
            print(f"  zygote={'on' if zygote_on else 'off'} build {i + 1}/{builds}: {seconds[-1]:.2f} s", flush=True)
    finally:
        holder.close()
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="build_start.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--builds", type=int, default=3, help="consecutive builds per setting (default 3)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    if args.builds < 2:
        p.error("--builds must be at least 2 (the first from a zygote includes its start)")
    out = {}
    with tempfile.TemporaryDirectory(prefix="build-start-") as tmp:
        for on in (True, False):
            secs = run(on, args.builds, args.device, Path(tmp) / "cache")
            out["zygote" if on else "fresh"] = {"seconds": secs, "median_after_first": statistics.median(secs[1:])}
    print(f"median build after the first: {out['zygote']['median_after_first']:.2f} s from the zygote, "
          f"{out['fresh']['median_after_first']:.2f} s started fresh")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
