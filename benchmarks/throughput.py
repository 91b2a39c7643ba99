"""Judged candidates per GPU-hour through the pool, and where the time goes.

The workload an RL run puts on the judge: many distinct candidates for L1-size tasks whose
baselines are already known. Every candidate is one of the suite's level-1 solutions with a unique
comment added to its C++/CUDA sources (and to the module), so each one is a build-cache miss and
its compile is real; the tasks' eager and torch.compile baselines are warm (measured while priming,
before the clock starts, and kept in the results database).

    1. one pool (judge workers: one per GPU, or --workers on the CPU backend; compile workers:
       the spare cores, or --compile-workers), a fresh cache folder and results database;
    2. priming: each chosen task is judged once with its unmodified solution (baselines measured,
       original builds cached, workers warm). Not counted;
    3. measuring: N distinct candidates, round-robin over the tasks, submitted as fast as the
       pool's back-pressure allows; the clock runs from the first submit to the last verdict.

Reported: candidates per hour per judge worker ("per GPU-hour" on CUDA, where the judges of one GPU
(--judges-per-gpu) count together), how many were correct and
how many had been built ahead by a compile worker, and the mean seconds per candidate in each
phase: waiting in the queue, compiling on a compile worker (`prebuild`), the judge's build step
(a cache look-up when the prebuild finished, else waiting for it or compiling), loading (`start`:
process start and ModelNew construction), the calls (verification and profiling are one phase:
every timed call's output is checked too), and what is left of the judge's own time (`other`:
clean-up, integrity checks). Busy fractions of the judge and compile workers say which side limits.

Each candidate is its own workspace (its own build folder), as the rollouts of an RL run are;
load_inline candidates of one task share an extension name, and the builder spreads them over up
to eight build folders of that name.

With `--built-ahead` every candidate is compiled into the judge's cache (all cores, one compiler
process per build) before the clock starts: the figure is then what the judge side alone sustains,
as on a GPU machine whose compiles run elsewhere (Ray's compile workers on CPU nodes), and the
build time per candidate in core-seconds says how many CPU cores that takes.

Step latency (`--agents K --steps M`): K agents share the judge, each judging M steps one after
another as an agent's environment does (submit, wait for the verdict, submit the next). Each step
is a new source in the agent's own workspace (`--warm`: the same source every step, its build cached).
Reported: the p50/p95/max of a step's latency and, per step, the mean wait in the queue (for the
steps ahead of it) and the judge's phases, so the share of a step spent waiting is measured.

Where the judge runs: an in-process pool of local worker processes (default), the pool's workers as
Ray actors on a local Ray instance (`--transport ray`), or a running `cuda-agent serve` (`--judge-url
URL`, its token in $CUDA_AGENT_SERVE_TOKEN; the service's own judge settings apply, and its
busy fractions are not visible from here).

Example (GPU):   python benchmarks/throughput.py --n 200
                 python benchmarks/throughput.py --agents 8 --steps 10 --warm
Example (CPU):   python benchmarks/throughput.py --device cpu --n 6 --compile-workers 1 -c compile_mode=none
                 (torch.compile's CPU baseline can take longer than the judge's per-call limit)
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from cuda_agent.measure.steps import PHASES, StepRecord, cold_variant, mean, step_summary, throughput_args



def run_agents(judge, tasks, originals, agents: int, steps: int, warm: bool, cold_variant) -> list[StepRecord]:
    """`agents` threads, each judging `steps` steps one after another on its own task (round-robin)
    and workspace; a step is submitted when the previous one's verdict has arrived."""
    records: list[StepRecord] = []
    lock = threading.Lock()

    def agent(k: int) -> None:
        task = tasks[k % len(tasks)]
        base = originals[task.name]
        same = cold_variant(base, f"agent{k}", one_folder=False) if warm else None
        for i in range(steps):
            cand = same or cold_variant(base, uuid.uuid4().hex, one_folder=False)
            # One workspace per agent (its build folder), as an agent edits its own files in place.
            cand = cand.model_copy(update={"origin": f"{base.origin} (agent {k})"})
            t0 = time.monotonic()
            try:
                v = judge.submit(task, cand).result()
            except Exception as exc:  # noqa: BLE001 - the judge could not judge this step: a failed step
                print(f"agent {k} step {i}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
                rec = StepRecord(k, i, time.monotonic() - t0, {}, False)
            else:
                rec = StepRecord(k, i, time.monotonic() - t0, dict(v.phase_s), v.correct)
            with lock:
                records.append(rec)

    threads = [threading.Thread(target=agent, args=(k,), daemon=True) for k in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records


def main(argv=None) -> int:
    args = throughput_args(argv, __doc__)
    from rich.console import Console
    from rich.table import Table

    from cuda_agent.candidate import Candidate
    from cuda_agent.judge import JudgeConfig, JudgeError
    from cuda_agent.pool import Pool, PoolConfig
    from cuda_agent.settings import SettingsError, apply_overrides
    from cuda_agent.suite import suite_solutions, suite_tasks

    console = Console()
    solutions = suite_solutions(args.device)
    tasks = [t for t in suite_tasks(args.device) if t.level == 1 and t.name in solutions]
    if args.tasks:
        tasks = [t for t in tasks if t.name in set(args.tasks)]
    originals = {t.name: Candidate.from_path(solutions[t.name]) for t in tasks}
    tasks = [t for t in tasks if cold_variant(originals[t.name], "probe") is not None]
    if not tasks:
        console.print("no level-1 task with a solution whose sources can be varied")
        return 2
    try:
        overrides = apply_overrides({}, args.config, JudgeConfig)
    except SettingsError as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    own_root = args.cache_root is None
    root = Path(tempfile.mkdtemp(prefix="throughput-")) if own_root else args.cache_root
    config = JudgeConfig.model_validate({**overrides, "device": args.device, "cache_dir": root / "cache"})
    pool_config = PoolConfig(judge_workers=args.workers, judges_per_gpu=args.judges_per_gpu,
                             compile_workers=args.compile_workers,
                             baseline_db=root / "results.sqlite")
    work = [(tasks[i % len(tasks)], cold_variant(originals[tasks[i % len(tasks)].name], uuid.uuid4().hex,
                                                          one_folder=False))
            for i in range(args.n)]
    client = None
    if args.judge_url:
        import os

        from cuda_agent.serve.client import JudgeClient

        client = JudgeClient(args.judge_url, os.environ.get("CUDA_AGENT_SERVE_TOKEN", ""), run="throughput")
        config = JudgeConfig.model_validate(client.info().judge_config)
    transport = None
    if args.transport == "ray":
        from cuda_agent.host import usable_cores
        from cuda_agent.pool.ray_transport import RayTransport

        transport = RayTransport(num_cpus=usable_cores(), include_dashboard=False)
    steps: list[StepRecord] = []
    try:
        with (client if client is not None else Pool(config, pool_config, transport)) as pool:
            if client is not None:
                n_judges, n_compile = client.health().judge_workers or 1, 0
            else:
                n_judges, n_compile = pool.n_judges, pool.n_compile
            console.print(f"{n_judges} judge worker(s), {n_compile} compile worker(s), "
                          f"{len(tasks)} tasks: {', '.join(t.name for t in tasks)}")
            t0 = time.monotonic()
            pool.wait_ready(600)
            console.print(f"workers ready in {time.monotonic() - t0:.1f} s; priming (baselines, original builds)")
            priming = [(t, pool.submit(t, originals[t.name])) for t in tasks]  # builds overlap
            broken = set()
            for t, future in priming:
                try:
                    v = future.result()
                except JudgeError as exc:  # its baseline cannot be measured here: leave the task out
                    console.print(f"  [red]{t.name}: {exc} (left out)[/red]")
                    broken.add(t.name)
                    continue
                console.print(f"  {t.name}: correct={v.correct} judge_s={v.judge_s:.1f}"
                              + (f" ({v.failure.category.value})" if v.failure else ""))
            work = [(t, c) for t, c in work if t.name not in broken]
            tasks = [t for t in tasks if t.name not in broken]
            if not work:
                console.print("no task left to measure")
                return 1
            ahead_s = None
            if args.built_ahead:  # (not with --agents: parse_args refuses the pair)
                from cuda_agent.host import usable_cores
                from cuda_agent.pool.prebuild import build_ahead

                t_ahead = time.monotonic()
                results = build_ahead([c for _, c in work], config, parallel=usable_cores(), jobs=1)
                ahead_s = time.monotonic() - t_ahead
                failed = sum(bool(r.failed) for r in results)
                console.print(f"built {len(results)} candidates ahead in {ahead_s:.1f} s ({failed} failed), "
                              f"{ahead_s * usable_cores() / max(len(results), 1):.1f} core-s each")
            before = pool.stats() if client is None else None
            t_start = time.monotonic()
            if args.agents:
                # Warm: one extra step per agent, not counted, builds each agent's source first.
                steps = run_agents(pool, tasks, originals, args.agents, args.steps + args.warm, args.warm,
                                   cold_variant)
                steps = [r for r in steps if not (args.warm and r.step == 0)]
                verdicts = []
            else:
                futures: list = []

                def feed() -> None:
                    for task, cand in work:
                        futures.append(pool.submit(task, cand))

                feeder = threading.Thread(target=feed, daemon=True)
                feeder.start()
                feeder.join()
                verdicts = [f.result() for f in futures]
            wall = time.monotonic() - t_start
            after = pool.stats() if client is None else None
            device_names = pool.device_names() if client is None else client.info().device_names
    finally:
        if transport is not None:
            transport.close()
        if own_root:
            shutil.rmtree(root, ignore_errors=True)

    if args.agents:
        summary = step_summary(steps)
        table = Table(title=f"Step latency: {args.agents} agents x {args.steps} {'warm' if args.warm else 'cold'} "
                            f"steps in {wall:.1f} s")
        table.add_column("")
        table.add_column("value", justify="right")
        for k in ("p50_s", "p95_s", "max_s", "mean_s"):
            table.add_row(f"step latency {k[:-2]} (s)", f"{summary[k]:.2f}")
        table.add_row("correct", f"{summary['correct']}/{summary['steps']}")
        for k in PHASES:
            table.add_row(f"mean s per step: {k}", f"{summary['mean_phase_s'][k]:.2f}")
        table.add_row("mean s per step: calls waiting for the device", f"{summary['mean_device_wait_s']:.2f}")
        table.add_row("share of a step waiting in the queue", f"{100 * summary['queue_share']:.0f}%")
        table.add_row("mean s per step outside the judge (transport)", f"{summary['mean_unaccounted_s']:.2f}")
        console.print(table)
        report = {"benchmark": "step_latency", "argv": sys.argv[1:] if argv is None else list(argv),
                  "environment": {"python": platform.python_version(), "platform": platform.platform(),
                                  "device": config.device, "device_names": device_names},
                  "judge_config": json.loads(config.model_dump_json(exclude={"cache_dir"})),
                  "where": args.judge_url and "service" or args.transport, "agents": args.agents,
                  "steps": args.steps, "warm": args.warm, "wall_s": wall, "judge_workers": n_judges, **summary,
                  "records": [{"agent": r.agent, "step": r.step, "latency_s": r.latency_s, "phase_s": r.phase_s}
                              for r in steps]}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {args.out}")
        return 0

    # per GPU where judges share GPUs (the judges of one GPU together), else per judge worker
    units = max(1, n_judges // args.judges_per_gpu) if args.device == "cuda" else n_judges
    per_hour = len(verdicts) / wall * 3600 / units
    phases = {k: mean([v.phase_s.get(k, 0.0) for v in verdicts]) for k in PHASES}
    judge_s = mean([v.judge_s or 0.0 for v in verdicts])
    in_judge = sum(phases[k] for k in ("build", "baseline", "start", "calls"))
    phases["other"] = max(judge_s - in_judge, 0.0)
    prebuilt = (after.prebuilt_in_time - before.prebuilt_in_time) if after else 0
    judge_busy = (after.judge_s - before.judge_s) / (wall * n_judges) if after else None
    compile_busy = (after.prebuild_s - before.prebuild_s) / (wall * n_compile) if after and n_compile else None
    unit = "GPU-hour" if args.device == "cuda" else "judge-worker-hour (CPU backend)"

    table = Table(title=f"Throughput: {len(verdicts)} distinct L1 candidates in {wall:.1f} s"
                        + (" (built before the clock)" if ahead_s is not None else ""))
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row(f"judged per {unit}", f"{per_hour:.0f}")
    table.add_row("correct", f"{sum(v.correct for v in verdicts)}/{len(verdicts)}")
    table.add_row("built ahead by a compile worker", f"{prebuilt}/{len(verdicts)}")
    table.add_row("judge workers busy", "-" if judge_busy is None else f"{100 * judge_busy:.0f}%")
    table.add_row("compile workers busy", "-" if compile_busy is None else f"{100 * compile_busy:.0f}%")
    for k in PHASES + ("other",):
        table.add_row(f"mean s per candidate: {k}", f"{phases[k]:.2f}")
    device_wait = mean([v.phase_s.get("calls:device_wait", 0.0) for v in verdicts])
    table.add_row("mean s per candidate: calls waiting for the device", f"{device_wait:.2f}")
    table.add_row("mean s per candidate: judge_s (build..other)", f"{judge_s:.2f}")
    console.print(table)
    # Per task: a single-file (load_inline) candidate compiles torch's headers in every translation
    # unit, a workspace only its kernels and a binding over a precompiled header, so the task mix
    # decides how much compiling a candidate costs.
    form = {t.name: c.kind for t, c in work}
    per_task = {}
    for name in dict.fromkeys(v.task_name for v in verdicts):
        vs = [v for v in verdicts if v.task_name == name]
        per_task[name] = {"form": form.get(name, "?"), "n": len(vs), "correct": sum(v.correct for v in vs),
                          **{f"mean_{k}_s": mean([v.phase_s.get(k, 0.0) for v in vs])
                             for k in ("prebuild", "build", "start", "calls")}}
    by_task = Table(title="Per task")
    for col in ("task", "form", "n", "correct", "prebuild s", "build s", "start s", "calls s"):
        by_task.add_column(col, justify="left" if col in ("task", "form") else "right")
    for name, r in per_task.items():
        by_task.add_row(name, r["form"], str(r["n"]), str(r["correct"]), f"{r['mean_prebuild_s']:.2f}",
                        f"{r['mean_build_s']:.2f}", f"{r['mean_start_s']:.2f}", f"{r['mean_calls_s']:.2f}")
    console.print(by_task)

    report = {
        "benchmark": "throughput", "argv": sys.argv[1:] if argv is None else list(argv),
        "environment": {"python": platform.python_version(), "platform": platform.platform(),
                        "device": args.device, "device_names": device_names},
        "judge_config": json.loads(config.model_dump_json(exclude={"cache_dir"})),
        "tasks": [t.name for t in tasks], "n": len(verdicts), "wall_s": wall, "judge_workers": n_judges,
        "compile_workers": n_compile, "judges_per_gpu": args.judges_per_gpu, "per_worker_hour": per_hour,
        "built_ahead_s": ahead_s,
        "unit": unit,
        "correct": sum(v.correct for v in verdicts), "prebuilt_in_time": prebuilt,
        "judge_busy": judge_busy, "compile_busy": compile_busy, "mean_phase_s": phases, "mean_judge_s": judge_s,
        "mean_device_wait_s": device_wait,
        "per_task": per_task,
        "failures": [v.failure.model_dump(mode="json") | {"task": v.task_name} for v in verdicts if v.failure],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
