"""What a compile worker can build for a candidate before a judge worker gets to it.

The judge's build cache is content-addressed (`Builder`: the key covers sources, flags, arch and
toolchain), so a library built here from the judge's own plan (`cuda_agent.judge.builds.plan`) by
the judge's own build step (`build_planned`) is a cache hit when the judge asks for it. What can
and cannot be planned ahead (a single file's load_inline calls are read statically) is described
there. Sources that break the policy are not built: the judge refuses them before any build.
"""

from __future__ import annotations

from pydantic import BaseModel

from cuda_agent import host
from cuda_agent.candidate import Candidate
from cuda_agent.judge.builds import Builder, BuildPlan, build_arch, build_planned, plan_build


def build_plan_ahead(builder: Builder, plan: BuildPlan) -> tuple[int, int, list[str]]:
    """Carry out the judge's plan into the builder's cache (`build_planned`: a spec already there
    costs a look-up; like the judge, the first failure ends it). A plan the judge refuses builds
    nothing and is no failure here (`plan.not_built` says why). Returns (built, already cached,
    the first line of the failure); a failure is only recorded: the judge builds the candidate
    again and reports the whole error in its verdict."""
    if plan.refused:
        return 0, 0, []
    try:
        outcome = build_planned(plan, builder)
    except Exception as exc:  # noqa: BLE001 - one candidate's trouble must not end the others
        return 0, 0, [f"{type(exc).__name__}: {exc}"[:200]]
    ok = [b for b in outcome.builds if b.failure is None]
    failed = []
    if outcome.failure is not None:
        lines = outcome.failure.message.splitlines()
        failed.append(f"{outcome.failure.category.value}: {lines[0][:200] if lines else ''}")
    return sum(not b.cached for b in ok), sum(b.cached for b in ok), failed


class AheadResult(BaseModel):
    """What `build_ahead` did for one candidate."""

    origin: str
    specs: int = 0
    built: int = 0
    cached: int = 0
    failed: list[str] = []
    skipped: list[str] = []
    seconds: float = 0.0


def build_ahead(candidates: list[Candidate], config, *, parallel: int = 4, jobs: int | None = None,
                on_result=None) -> list[AheadResult]:
    """Build what the judge will ask for, for many candidates at once, into `config.cache_dir`.

    `parallel` builds run side by side, each with `jobs` compiler processes (default: the cores
    shared out). Each concurrent build has its own sandbox uid when running as root, because a
    build's clean-up kills every process of its uid. A failed build is only counted: the judge
    builds it again and reports the compiler's error in its verdict. `on_result` is called with
    each `AheadResult` as it finishes (for a progress bar)."""
    import os
    import queue
    import threading
    import time

    from cuda_agent.judge.sandbox import work_root_dir
    from cuda_agent.judge.supply import ZygoteHolder

    arch = build_arch(config.device, config.arch)
    parallel = max(1, min(parallel, len(candidates) or 1))
    jobs = jobs or max(1, host.usable_cores() // parallel)
    # one uid per parallel build, leased for the run (clear of the judges', their spares' and pools')
    lease = host.lease_uids(host.PREBUILD_UIDS, range(parallel), os.getpid())
    base_uid = lease.base
    todo: queue.Queue = queue.Queue()
    for index, cand in enumerate(candidates):
        todo.put((index, cand))
    results: list[AheadResult | None] = [None] * len(candidates)
    zygote = ZygoteHolder(config, builds=True)  # one for every thread: its requests are serialised

    def run(k: int) -> None:
        builder = Builder.for_config(config, work_root_dir(), arch=arch, uid=base_uid + k, jobs=jobs, zygote=zygote)
        while True:
            try:
                index, cand = todo.get_nowait()
            except queue.Empty:
                return
            t0 = time.monotonic()
            plan = plan_build(cand, config.device, config.policy)
            built, cached, failed = build_plan_ahead(builder, plan)
            res = AheadResult(origin=cand.origin, specs=len(plan.specs), skipped=plan.not_built, built=built,
                              cached=cached, failed=failed, seconds=time.monotonic() - t0)
            results[index] = res
            if on_result is not None:
                on_result(res)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(parallel)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        zygote.close()
        lease.close()
    return [r for r in results if r is not None]
