"""The agent's `profile` tool on every bundled workspace solution, as a model sees it, with the
judge's runtime beside Nsight Compute's kernel time for the same candidate (issue: hardware truth).

    python benchmarks/profile_suite.py --out runs/profile           # every workspace solution (CUDA)
    python benchmarks/profile_suite.py --only 3_Softmax_Rows --out runs/profile

Per solution: the judge's verdict (runtime, eager and torch.compile times, speed-of-light and the
runtime's share of it), then Nsight Compute's per-kernel summary of one call with a cold L2 (the
text the agent receives). The table puts the judge's median runtime beside the sum of the kernels'
`gpu__time_duration` in that one call: for a kernel-bound candidate the two should agree within a
few per cent; a launch-bound one shows the launch gaps the judge's clock includes and ncu's does
not. Writes OUT/profile_suite.md (table and every summary) and OUT/profile_suite.json.
Single-file solutions are not workspaces, so the tool cannot profile them; `cuda-agent bench`
reports their share of speed-of-light.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

GPU_TIME = re.compile(r"([0-9.]+) us of GPU time in one call")


def workspace_solutions(only: list[str] | None) -> list[str]:
    from cuda_agent.suite import suite_solutions

    names = [name for name, path in suite_solutions("cuda").items() if path.is_dir()]
    if only:
        missing = sorted(set(only) - set(names))
        if missing:
            sys.exit(f"error: no workspace solution named {', '.join(missing)} (have: {', '.join(names)})")
        names = [n for n in names if n in only]
    return names


def profile_one(name: str, work: Path, cache: Path) -> dict:
    """Run the profile tool on one bundled workspace solution; the observation's text and figures."""
    from cuda_agent.agent.tools import Toolbox
    from cuda_agent.rollout.evaluator import LocalEvaluator
    from cuda_agent.agent.workspace import create_workspace
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.suite import suite_solutions, suite_tasks

    task = next(t for t in suite_tasks("cuda") if t.name == name)
    ws = create_workspace(task, work / name, "cuda")
    shutil.copytree(suite_solutions("cuda")[name], ws, dirs_exist_ok=True)  # model_new.py and kernels/
    gate = LocalEvaluator(JudgeConfig(device="cuda", cache_dir=str(cache)))
    box = Toolbox(task, ws, gate)
    t0 = time.perf_counter()
    try:
        obs = box.call("profile", {"target": "candidate"})
    finally:
        box.close()
        gate.close()
    v = obs.verdict
    row: dict = {"task": name, "level": task.level, "ok": obs.ok, "tool_s": round(time.perf_counter() - t0, 1),
                 "text": obs.text}
    if v is not None:
        sol = v.speed_of_light
        row.update(correct=v.correct,
                   runtime_ms=v.runtime.median_ms if v.runtime else None,
                   timing_source=v.runtime.source if v.runtime else None,
                   eager_ms=v.eager.median_ms if v.eager else None,
                   compile_ms=v.compiled_ref.median_ms if v.compiled_ref else None,
                   sol_ms=sol.sol_ms if sol else None, bound=sol.bound if sol else None,
                   sol_share=v.sol_share, eager_sol_share=v.eager_sol_share)
    m = GPU_TIME.search(obs.text)
    row["ncu_ms"] = float(m.group(1)) / 1e3 if m else None
    if row.get("runtime_ms") and row["ncu_ms"]:
        row["judge_over_ncu"] = row["runtime_ms"] / row["ncu_ms"]
    return row


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    lines = ["| task | level | correct | judge ms | ncu ms (kernels, 1 call) | judge / ncu | eager ms | "
             "SOL ms | bound | share of SOL | eager's share |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r.get('level', '-')} | {r.get('correct', False)} | "
                     f"{fmt(r.get('runtime_ms'), '.4f')} | {fmt(r.get('ncu_ms'), '.4f')} | "
                     f"{fmt(r.get('judge_over_ncu'), '.3f')} | {fmt(r.get('eager_ms'), '.4f')} | "
                     f"{fmt(r.get('sol_ms'), '.4f')} | {r.get('bound') or '-'} | "
                     f"{fmt(r.get('sol_share'), '.1%')} | {fmt(r.get('eager_sol_share'), '.1%')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/profile"), help="folder for the table and summaries")
    ap.add_argument("--only", nargs="*", help="these solutions only (folder names under suite/solutions/cuda)")
    ap.add_argument("--cache", type=Path, default=None, help="judge cache folder (default: a temporary one)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("error: the profile tool's Nsight Compute path needs a CUDA GPU", file=sys.stderr)
        return 3
    names = workspace_solutions(args.only)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="profile-suite-") as tmp:
        cache = args.cache or Path(tmp) / "cache"
        for i, name in enumerate(names, 1):
            print(f"[{i}/{len(names)}] {name} ...", flush=True)
            try:
                row = profile_one(name, Path(tmp), cache)
            except Exception as exc:  # one solution's failure is reported, the rest still run
                row = {"task": name, "ok": False, "text": f"profile failed: {type(exc).__name__}: {exc}"}
            rows.append(row)
            print(f"  runtime {fmt(row.get('runtime_ms'), '.4f')} ms, ncu {fmt(row.get('ncu_ms'), '.4f')} ms, "
                  f"share of SOL {fmt(row.get('sol_share'), '.1%')} ({row.get('tool_s', '-')} s)", flush=True)
    body = [f"# The profile tool on the bundled workspace solutions ({torch.cuda.get_device_name(0)})", "",
            table(rows), ""]
    for r in rows:
        body += [f"## {r['task']}", "", "```", r["text"], "```", ""]
    (args.out / "profile_suite.md").write_text("\n".join(body))
    (args.out / "profile_suite.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    for r in rows:
        print(f"\n== {r['task']}\n{r['text']}")
    return 0 if all(r.get("correct") for r in rows) else 1
