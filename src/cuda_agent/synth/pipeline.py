"""`cuda-agent synth`: compose candidates, filter them in parallel, export what survives.

Candidate k is composed from seed `seed * 10_000_000 + k` (so runs with different `--seed` never
share candidates). Compose and the static filters run in this process in candidate order;
execution checks run on a pool of isolated workers. Every finished candidate is appended to
`OUT/candidates.jsonl` at once, so an interrupted run continues where it stopped: a rerun with
the same settings skips the indices already recorded (settings that change what a candidate is
must match; `OUT/run.json` records them). When `n` candidates are accepted, the first `n` by
index are exported (`tasks.parquet`, `tasks.jsonl`) with a report of how many each filter removed.

With `judge_check`, every accepted candidate is then held to the judge's reference checks
(`Judge.check_reference`, in parallel judge processes once the filter workers are stopped); a task
that fails is rejected as `judge_reference` (its record appended again with the verdict) and
replacements are generated, so that every exported task passed the judge. With `judge_overlap`
(the default), judge processes stay up beside the filter workers and take each task as the filters
accept it (`JudgeStream`); only what they could not answer (out of GPU memory, a judge that died)
is checked after the filters stop. Without it, all checks wait for the filter workers to stop.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from .catalog import load_or_crawl
from .compose import ComposeConfig, ComposeError, Composition, LLMComposer, LLMConfig, ProgrammaticComposer
from .decontam import BenchmarkIndex, DecontamConfig, Nearest
from .filters import FILTERS, HAZARD_FILTERS, CheckResult, FilterConfig, Rejection, StaticFilter, WorkerPool
from .judgecheck import JudgeStream, ReferenceCheck, check_tasks

SEED_STRIDE = 10_000_000


class SynthConfig(BaseModel):
    """One run of the pipeline. Fields marked (identity) must match when a run is resumed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(6000, ge=1, description="accepted tasks wanted")
    out: Path = Field(description="output folder (candidates log, catalog, exports, report)")
    seed: int = Field(0, ge=0, description="(identity) base seed of the candidate stream")
    workers: int = Field(4, ge=1, description="parallel execution workers")
    composer: Literal["programmatic", "llm"] = Field("programmatic", description="(identity)")
    compose: ComposeConfig = Field(default_factory=ComposeConfig, description="(identity)")
    filters: FilterConfig = Field(default_factory=FilterConfig)
    decontam: DecontamConfig = Field(default_factory=DecontamConfig)
    benchmark_dir: Path | None = Field(None, description="benchmark to decontaminate against (e.g. KernelBench/)")
    catalog: Path | None = Field(None, description="seed catalog to use (default OUT/catalog.jsonl, crawled once)")
    llm: LLMConfig | None = None
    max_candidates: int | None = Field(None, description="stop after this many candidates (default 50 * n)")
    time_limit_s: float | None = Field(None, gt=0, description="start no new candidate after this many seconds; "
                                                               "what was accepted is exported (resume to go on)")
    judge_check: bool = Field(False, description="hold every accepted task to the judge's reference checks; "
                                                 "export only those that pass")
    judge_parallel: int = Field(4, ge=1, description="judge processes for judge_check (GPUs taken in turn)")
    judge_overlap: bool = Field(True, description="with judge_check: judge each task as the filters accept it, "
                                                  "beside the filter workers (whose GPU memory shares then leave "
                                                  "room for the judges); off: after the filters stop")

    def identity(self) -> dict:
        return {"seed": self.seed, "composer": self.composer, "compose": self.compose.model_dump()}


class CandidateRecord(BaseModel):
    """One line of `candidates.jsonl`: what was made and what the filters said."""

    index: int
    seed: int
    name: str = ""
    ops: list[str] = Field(default_factory=list)
    composer: str = ""
    ast_hash: str = ""
    accepted: bool = False
    rejection: Rejection | None = None
    nearest: Nearest | None = None
    check: CheckResult | None = None
    source: str = ""      # the final (rescaled) source; kept for accepted candidates only
    judge: ReferenceCheck | None = None   # the judge's reference checks (judge_check runs only)


class SynthReport(BaseModel):
    """A run's outcome. `accepted` (exported) + `accepted_not_exported` + the sum of `rejected_by`
    is `candidates`: every candidate is counted once."""

    accepted: int
    candidates: int
    rejected_by: dict[str, int]
    accepted_not_exported: int = 0   # passed the filters beyond --n (workers finish what they hold) or
    #                                  still waiting for the judge's check
    wall_s: float
    tasks_per_hour: float
    candidates_per_hour: float
    exported: int
    config: dict
    compile_check: bool = True  # whether torch.compile was checked against eager
    shortcut_checks: bool = True
    n_input_sets: int = 0
    diversity: dict = {}       # statistics of the exported tasks (see diversity())
    judge_checked: int = 0     # tasks held to the judge's reference checks in this run
    judge_s: float = 0.0
    phases: list[dict] = []    # each generate/filter and judge phase of this run (also OUT/phases.jsonl)
    criterion: bool = True     # whether the export criterion held every accepted task (criterion.py)
    hazard_rejections: dict[str, int] = {}   # candidates removed for non-finite, ill-conditioned or criterion
    #                                          reasons (HAZARD_FILTERS): what hazard-aware composition avoids
    hazard_share: float = 0.0  # their share of the candidates
    hazard_guards: bool = True  # whether the composer probed seeds and guarded or left out the unsafe ones
    refused_seeds: dict[str, str] = {}   # seed@rank the composer left out, with what it did unguarded


def _log_path(out: Path) -> Path:
    return out / "candidates.jsonl"


class _Phases:
    """What each phase of a run did and how long it took, appended to OUT/phases.jsonl as each one
    ends: a run cut short (a time limit, a kill) still says how fast it generated and judged."""

    def __init__(self, out: Path):
        self.path = out / "phases.jsonl"
        self.done: list[dict] = []
        self.t = time.monotonic()

    def end(self, phase: str, **counts) -> None:
        now = time.monotonic()
        row = {"phase": phase, "wall_s": round(now - self.t, 3), **counts}
        self.t = now
        self.done.append(row)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def _judge_name(rec: CandidateRecord) -> str:
    """The task name a judge's reference check of `rec` carries (its index first, to map it back)."""
    return f"{rec.index}_{rec.name}"


def read_records(out: Path) -> list[CandidateRecord]:
    path = _log_path(out)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            records.append(CandidateRecord.model_validate_json(line))
        except ValueError:
            continue    # a line cut by an interrupted write: that candidate is redone
    return records


def rejection_table(records: list[CandidateRecord]) -> dict[str, int]:
    counts = Counter(r.rejection.filter for r in records if r.rejection is not None)
    return {f: counts[f] for f in FILTERS if counts.get(f)} | {f: c for f, c in counts.items() if f not in FILTERS}


class _Progress:
    """Callbacks for a progress display (the CLI passes a rich one)."""

    def start(self, total: int, done: int) -> None: ...
    def update(self, accepted: int, candidates: int, last: CandidateRecord) -> None: ...
    def stop(self) -> None: ...


def run_synth(cfg: SynthConfig, progress: _Progress | None = None) -> SynthReport:
    progress = progress or _Progress()
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    run_file = out / "run.json"
    if run_file.exists():
        prev = json.loads(run_file.read_text())
        if prev.get("identity") != json.loads(json.dumps(cfg.identity())):
            raise ValueError(f"{out} holds a run with other settings {prev.get('identity')}; "
                             "use another --out or the same --seed/composer settings")
    run_file.write_text(json.dumps({"identity": cfg.identity(), "config": json.loads(cfg.model_dump_json()),
                                    "torch": torch.__version__}, indent=1))
    catalog_path = cfg.catalog or out / "catalog.jsonl"
    seeds = load_or_crawl(catalog_path)
    if cfg.composer == "llm":
        composer = LLMComposer(seeds, cfg.llm or LLMConfig(), cfg.compose)
    else:
        composer = ProgrammaticComposer(seeds, cfg.compose)
    bench = BenchmarkIndex.from_dir(cfg.benchmark_dir, trace=cfg.decontam.trace) if cfg.benchmark_dir else None
    static = StaticFilter(bench, cfg.decontam)

    records = {r.index: r for r in read_records(out)}
    for r in sorted(records.values(), key=lambda r: r.index):
        if r.ast_hash and (r.rejection is None or r.rejection.filter not in ("duplicate", "invalid_source")):
            static.remember(r.ast_hash, r.name)
    accepted = sum(r.accepted for r in records.values())
    accepted_before = accepted
    limit = cfg.max_candidates or 50 * cfg.n
    t0 = time.monotonic()
    deadline = t0 + cfg.time_limit_s if cfg.time_limit_s else None
    done_before = len(records)
    progress.start(cfg.n, accepted)
    log = _log_path(out).open("a", encoding="utf-8")
    if log.tell() and not _log_path(out).read_bytes().endswith(b"\n"):
        log.write("\n")    # an interrupted run cut its last line: start the next one cleanly

    def record(rec: CandidateRecord) -> None:
        nonlocal accepted
        before = records.get(rec.index)
        accepted += rec.accepted - (before.accepted if before is not None else 0)
        records[rec.index] = rec
        log.write(rec.model_dump_json() + "\n")
        log.flush()
        progress.update(accepted, len(records), rec)

    def passed_judge(r: CandidateRecord) -> bool:
        return r.accepted and (not cfg.judge_check or (r.judge is not None and r.judge.ok))

    checked = {"n": 0, "failed": 0}   # reference checks of this run (streamed and after the filters)

    def judged(check: ReferenceCheck) -> None:
        # recorded as each verdict comes: an interrupted check keeps what it finished
        index = int(check.name.split("_", 1)[0])   # the index _judge_name put first
        rec = records[index].model_copy(update={"judge": check})
        checked["n"] += 1
        if not check.ok:
            checked["failed"] += 1
            rec.accepted, rec.source = False, ""
            rec.rejection = Rejection(filter="judge_reference", message=check.failure or "failed")
        record(rec)

    overlap = cfg.judge_check and cfg.judge_overlap
    stream: JudgeStream | None = None
    streamed: set[int] = set()   # indices given to the stream (what it leaves unjudged is checked later)

    def feed(rec: CandidateRecord) -> None:
        if stream is not None and rec.accepted and rec.judge is None and rec.index not in streamed:
            streamed.add(rec.index)
            stream.submit(_judge_name(rec), rec.source)

    def take_verdicts(timeout: float = 0.0) -> None:
        for check in stream.results(timeout) if stream is not None else ():
            judged(check)

    pending: dict[Future, CandidateRecord] = {}
    phases = _Phases(out)
    phase_from = (len(records), accepted, 0, 0)   # records, acceptances, checks, failures when the phase began
    index = 0
    interrupted = True
    try:
        if overlap:
            stream = JudgeStream(cfg.filters.device, cfg.judge_parallel)
            for r in sorted(records.values(), key=lambda r: r.index):
                feed(r)   # accepted on an earlier run and not judged yet
        # the pool closes first on the way out: an interrupt kills the workers instead of waiting
        # for their tasks (those candidates are not recorded and are redone on resume)
        with ThreadPoolExecutor(cfg.workers) as ex, \
                WorkerPool(cfg.filters, cfg.workers, reserve=cfg.judge_parallel if overlap else 0) as pool:
            while True:
                # keep every worker busy with one queued candidate behind it
                while accepted + len(pending) < cfg.n + cfg.workers and len(pending) < 2 * cfg.workers \
                        and index < limit and accepted < cfg.n \
                        and (deadline is None or time.monotonic() < deadline):
                    k = index
                    index += 1
                    if k in records:
                        continue
                    rec = _prepare(composer, static, cfg, k)
                    if rec.rejection is not None:
                        record(rec)
                        continue
                    pending[ex.submit(pool.check, rec.source)] = rec
                if pending:
                    # with the stream, its verdicts are taken between the filters' results
                    finished, _ = wait(list(pending), timeout=0.5 if stream is not None else None,
                                       return_when=FIRST_COMPLETED)
                    for fut in finished:
                        rec = pending.pop(fut)
                        done = _finish(rec, fut.result(), static)
                        record(done)
                        feed(done)
                    take_verdicts()
                    continue
                if stream is not None and stream.in_flight:
                    # the filters are idle: the judges finish what they hold (a failure among it
                    # has the loop above generate a replacement)
                    take_verdicts(timeout=1.0)
                    continue
                todo = [r for r in records.values() if r.accepted and r.judge is None] if cfg.judge_check else []
                if todo:
                    # The judge's reference checks of what the filters accepted (with the stream:
                    # what it left unjudged). The filter workers stop first (they hold GPU
                    # memory), the stream's judges too; the next candidate starts the workers again.
                    pool.close()
                    if stream is not None:
                        stream.close()
                        stream = None
                if len(records) > phase_from[0]:
                    # with the stream the phase also checked (and `accepted` is net of its failures)
                    extra = {"checked": checked["n"] - phase_from[2], "failed": checked["failed"] - phase_from[3]} \
                        if overlap else {}
                    phases.end("filter", candidates=len(records) - phase_from[0], accepted=accepted - phase_from[1],
                               accepted_total=accepted, **extra)
                if not todo:
                    break
                failed_before = checked["failed"]
                verdicts = check_tasks([(_judge_name(r), r.source) for r in todo], cfg.filters.device,
                                       cfg.judge_parallel, on_result=judged)
                phases.end("judge", checked=len(verdicts), failed=checked["failed"] - failed_before)
                phase_from = (len(records), accepted, checked["n"], checked["failed"])
                if not verdicts:
                    break   # the judges could not run at all: stop rather than loop
        interrupted = False
    finally:
        if stream is not None:
            stream.kill() if interrupted else stream.close()
        log.close()
        progress.stop()
    wall = time.monotonic() - t0
    from .export import export

    ordered = sorted(records.values(), key=lambda r: r.index)
    chosen = [r for r in ordered if passed_judge(r)][: cfg.n]
    exported = export(chosen, out)
    new = len(records) - done_before
    rejected = rejection_table(ordered)
    hazards = {f: rejected[f] for f in HAZARD_FILTERS if rejected.get(f)}
    report = SynthReport(
        accepted=len(chosen), candidates=len(records), rejected_by=rejected, wall_s=wall,
        criterion=cfg.filters.criterion, hazard_rejections=hazards,
        hazard_share=round(sum(hazards.values()) / len(records), 4) if records else 0.0,
        hazard_guards=cfg.compose.hazard_guards,
        refused_seeds=composer.refused() if hasattr(composer, "refused") else {},
        accepted_not_exported=sum(r.accepted for r in ordered) - len(chosen),
        compile_check=cfg.filters.compile, shortcut_checks=cfg.filters.shortcuts,
        n_input_sets=cfg.filters.n_input_sets if cfg.filters.shortcuts else 0, diversity=diversity(chosen),
        tasks_per_hour=(accepted - accepted_before) / wall * 3600 if wall > 0 else 0.0,
        candidates_per_hour=new / wall * 3600 if wall > 0 else 0.0, exported=exported,
        config=json.loads(cfg.model_dump_json()), phases=phases.done,
        judge_checked=checked["n"],
        judge_s=sum(p["wall_s"] for p in phases.done if p["phase"] == "judge"))
    (out / "report.json").write_text(report.model_dump_json(indent=1))
    return report


def diversity(records: list[CandidateRecord]) -> dict:
    """How varied a set of tasks is: distinct seed ops and chains, ops per task, how much the most
    used op dominates, normalised entropy of op use, and closeness to the benchmark."""
    import math

    ops = Counter(op for r in records for op in r.ops)
    n_ops = sum(ops.values())
    entropy = -sum(c / n_ops * math.log(c / n_ops) for c in ops.values()) if n_ops else 0.0
    scores = [r.nearest.score for r in records if r.nearest is not None]
    return {
        "tasks": len(records),
        "distinct_ops": len(ops),
        "distinct_chains": len({tuple(r.ops) for r in records}),
        "ops_per_task": dict(sorted(Counter(len(r.ops) for r in records).items())),
        "top_ops": dict(ops.most_common(5)),
        "top_op_share": round(ops.most_common(1)[0][1] / n_ops, 4) if n_ops else 0.0,
        "op_entropy_normalised": round(entropy / math.log(len(ops)), 4) if len(ops) > 1 else 0.0,
        "benchmark_similarity_max": round(max(scores), 4) if scores else None,
        "benchmark_similarity_mean": round(sum(scores) / len(scores), 4) if scores else None,
    }


def _prepare(composer, static: StaticFilter, cfg: SynthConfig, k: int) -> CandidateRecord:
    seed = cfg.seed * SEED_STRIDE + k
    rec = CandidateRecord(index=k, seed=seed, composer=cfg.composer)
    try:
        comp: Composition = composer.compose(seed)
    except ComposeError as exc:
        rec.rejection = Rejection(filter="compose_error", message=str(exc))
        return rec
    rec.name, rec.ops = comp.name, list(comp.ops)
    rejection, near, digest = static.check(comp)
    rec.ast_hash, rec.nearest, rec.rejection = digest, near, rejection
    rec.source = comp.source if rejection is None else ""
    return rec


def _finish(rec: CandidateRecord, result: CheckResult, static: StaticFilter | None = None) -> CandidateRecord:
    rec.check = result.model_copy(update={"source": ""})
    rec.accepted = result.accepted
    rec.rejection = result.rejection
    rec.source = result.source if result.accepted else ""
    if result.accepted and static is not None:
        # the second decontamination pass: what the task runs, traced by the worker
        rejection, near = static.check_trace(result.source, result.trace)
        if near is not None:
            rec.nearest = near
        if rejection is not None:
            rec.accepted, rec.rejection, rec.source = False, rejection, ""
    return rec
