"""Judging the records through the project's pool, each result appended as it arrives."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from cuda_agent.console import make_console

from .corpus import Record, VERDICTS_FILE, append_result, interleaved


def judge_records(records: list[Record], out: Path, config, pool_config, done: dict[str, dict],
                  time_budget_s: float | None = None) -> tuple[int, int]:
    """Judge the records not in `done` through the pool, appending each result as it arrives.
    With a time budget, nothing new is submitted once it is spent and records still waiting for a
    judge worker are withdrawn (the ones being judged finish): a later run takes them up.
    Returns (judged now, left for a later run)."""
    import queue
    from concurrent.futures import CancelledError

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from cuda_agent.candidate import Candidate
    from cuda_agent.judge import JudgeError
    from cuda_agent.pool import Pool, PoolError, PoolFull
    from cuda_agent.tasks import Task, TaskError

    console = make_console(stderr=True)
    deadline = None if time_budget_s is None else time.monotonic() + time_budget_s
    # A pool error says nothing about the record (no worker could start, the pool was shut down):
    # such records are judged again.
    todo = interleaved([r for r in records
                        if r.key not in done or (done[r.key].get("error") or {}).get("kind") == "pool_error"])
    console.print(f"{len(records)} records, {len(records) - len(todo)} already judged in {out / VERDICTS_FILE}; "
                  f"judging {len(todo)} on {config.device} ({config.policy} policy)")
    if not todo:
        return 0, 0
    base = {"settings": settings_of(config)["digest"]}
    pending = []
    for r in todo:
        try:
            task = Task.from_source(r.problem.read_text(), name=r.task_name, origin=str(r.problem),
                                    group=f"level{r.level}", level=r.level)
        except (TaskError, OSError, UnicodeDecodeError) as exc:
            entry = _entry(r, base, error={"kind": "task_error", "message": str(exc)})
            append_result(out, entry)
            done[r.key] = entry
            continue
        pending.append((r, task, Candidate.from_source(r.code, origin=f"{r.key}.py")))

    finished: queue.Queue = queue.Queue()
    futures = []
    feeder_error: list[BaseException] = []
    judged = 0
    with Pool(config, pool_config) as pool:
        def feed() -> None:
            submitted = 0
            try:
                for r, task, cand in pending:
                    wait = None if deadline is None else deadline - time.monotonic()
                    if wait is not None and wait <= 0:
                        break
                    try:
                        future = pool.submit(task, cand, timeout=wait)
                    except PoolFull:  # the budget ran out while the queue was full
                        break
                    futures.append(future)
                    submitted += 1
                    future.add_done_callback(lambda f, r=r, task=task, cand=cand: finished.put((r, task, cand, f)))
            except PoolError as exc:
                feeder_error.append(exc)
            finally:
                finished.put(("fed", submitted))

        feeder = threading.Thread(target=feed, name="fidelity-feeder", daemon=True)
        feeder.start()
        correct = failed = received = 0
        expected: int | None = None
        withdrawn = False
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                      console=console, transient=True) as progress:
            bar = progress.add_task("judging", total=len(pending), status="")
            while expected is None or received < expected:
                if deadline is not None and not withdrawn and time.monotonic() >= deadline:
                    withdrawn = True
                    for f in list(futures):
                        f.cancel()  # only those still waiting for a judge worker; running ones finish
                try:
                    got = finished.get(timeout=1.0)
                except queue.Empty:
                    continue
                if got[0] == "fed":
                    expected = got[1]
                    if feeder_error and not futures:
                        raise feeder_error[0]
                    continue
                received += 1
                r, task, cand, future = got
                ids = {"task_id": task.id, "candidate_hash": cand.hash}
                try:
                    verdict = future.result()
                except CancelledError:
                    continue
                except JudgeError as exc:  # the judge could not use the task (baseline failed, reference broken)
                    entry = _entry(r, base | ids, error={"kind": "judge_error", "message": str(exc)})
                except PoolError as exc:
                    entry = _entry(r, base | ids, error={"kind": "pool_error", "message": str(exc)})
                except Exception as exc:  # anything else from the pool's side is the judge's, never the record's
                    entry = _entry(r, base | ids, error={"kind": "judge_error",
                                                         "message": f"{type(exc).__name__}: {exc}"})
                else:
                    entry = _entry(r, base | ids, verdict=verdict.model_dump(mode="json"))
                append_result(out, entry)
                done[r.key] = entry
                judged += 1
                ok = bool(entry.get("verdict") and entry["verdict"].get("correct"))
                correct += ok
                failed += not ok
                progress.update(bar, advance=1, description=f"judged {r.key}",
                                status=f"[green]{correct} correct[/green] [red]{failed} not[/red]")
                if not console.is_terminal:  # a log gets no bar (rich draws none there): one line per record
                    console.print(f"[{judged}/{len(pending)}] {r.key}: {_outcome(entry)}", markup=False,
                                  highlight=False)
        feeder.join()
    if feeder_error:
        console.print(f"[red]the pool stopped taking records: {feeder_error[0]}[/red]")
    left = len(pending) - judged
    if left:
        console.print(f"{left} records left for a later run (rerun with the same --out to judge them)")
    return judged, left


def _outcome(entry: dict) -> str:
    """A judged record in a few words, for the log's line."""
    verdict = entry.get("verdict")
    if verdict is None:
        return f"not judged ({(entry.get('error') or {}).get('kind', 'error')})"
    if verdict.get("correct"):
        return "correct"
    return f"rejected ({(verdict.get('failure') or {}).get('category', 'incorrect')})"


def _entry(r: Record, base: dict, verdict: dict | None = None, error: dict | None = None) -> dict:
    return {"key": r.key, "level": r.level, "problem": r.number, "problem_id": r.problem_id, "model": r.model,
            "file": r.file, "task": r.task_name, **base, "judged_at": time.time(), "verdict": verdict, "error": error}


def settings_of(config) -> dict:
    from cuda_agent.bench import settings_digest

    return {"digest": settings_digest(config),
            "summary": f"device={config.device} policy={config.policy} compile_mode={config.compile_mode}",
            "config": json.loads(config.model_dump_json(exclude={"cache_dir", "sandbox_uid", "use_zygote"}))}
