"""The report: statistics, the per-level tables, runs compared, the markdown and the console."""

from __future__ import annotations

import math
import statistics
from collections import Counter

from .corpus import CLASSES, Corpus, Record
from .ncu import _ncu_row_note
from .rules import classify, first_line, result_kind_and_message


def rankdata(values: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank (as scipy.stats.rankdata's 'average')."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the ranks (ties averaged). None below 3 pairs or
    when either side is constant."""
    if len(x) != len(y) or len(x) < 3:
        return None
    import numpy as np

    rx, ry = np.asarray(rankdata(x)), np.asarray(rankdata(y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    return None if den == 0 else float((rx * ry).sum()) / den


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


# ---------------------------------------------------------------------------------------------
# Report

def build_report(corpus: Corpus, records: list[Record], results: dict[str, dict], explain: dict[str, dict],
                 settings: dict, near_factor: float, ncu: list[dict] | None, ncu_note: str | None) -> dict:
    rows = []
    cfg = {"near_factor": near_factor}
    for r in records:
        entry = results.get(r.key)
        if entry is None:
            continue
        rule_cls, rule, reason = classify(entry, cfg)
        cls, reviewed = rule_cls, False
        if r.key in explain and rule_cls != "correct":  # a review explains a refusal, never overrides a pass
            cls, reason, reviewed = explain[r.key]["class"], explain[r.key]["reason"], True
        kind, message = result_kind_and_message(entry) if rule_cls != "correct" else ("", "")
        v = entry.get("verdict") or {}
        runtime = (v.get("runtime") or {}).get("median_ms")
        eager = (v.get("eager") or {}).get("median_ms")
        compiled = (v.get("compiled_ref") or {}).get("median_ms")
        correct = bool(v.get("correct"))
        rows.append({
            "key": r.key, "level": r.level, "problem": r.number, "task": r.task_name, "model": r.model,
            "correct": correct, "class": cls, "rule_class": rule_cls, "rule": rule, "reason": reason,
            "reviewed": reviewed, "category": kind, "message": first_line(message, kind),
            "runtime_ms": runtime, "eager_ms": eager, "compile_ms": compiled,
            "judge_speedup": eager / runtime if correct and runtime and eager else None,
            "judge_compile_speedup": compiled / runtime if correct and runtime and compiled else None,
            "recorded_speedup": r.torch_speedup, "recorded_compile_speedup": r.torch_compile_speedup,
        })
    levels = sorted({r.level for r in records})

    def share(rs: list[dict]) -> dict:
        n = len(rs)
        c = sum(x["correct"] for x in rs)
        classes = {k: sum(x["class"] == k for x in rs) for k in ("correct",) + CLASSES}
        # Agreement with the leaderboard where the judge differs from KernelBench only by design
        # (a documented policy difference), and the share with no judge problem at all.
        return {"judged": n, "correct": c, "share": c / n if n else None, "classes": classes,
                "share_with_policy": (c + classes["policy_difference"]) / n if n else None,
                "share_no_judge_problem": (n - classes["judge_problem"]) / n if n else None}

    per_level = {str(lv): share([x for x in rows if x["level"] == lv]) for lv in levels}
    rule_counts = Counter((x["rule"], x["rule_class"]) for x in rows if x["rule"] != "correct")

    def corr(field_j: str, field_r: str, rs: list[dict]) -> dict:
        pairs = [(x[field_j], x[field_r]) for x in rs
                 if x["correct"] and x[field_j] and x[field_r] and x[field_r] > 0]
        rho = spearman([a for a, _ in pairs], [b for _, b in pairs])
        ratio = geomean([a / b for a, b in pairs])
        return {"n": len(pairs), "spearman": rho, "geomean_judge_over_recorded": ratio}

    correlation = {"overall": corr("judge_speedup", "recorded_speedup", rows),
                   "per_level": {str(lv): corr("judge_speedup", "recorded_speedup",
                                               [x for x in rows if x["level"] == lv]) for lv in levels}}
    if any(x["judge_compile_speedup"] for x in rows):
        correlation["vs_compile"] = corr("judge_compile_speedup", "recorded_compile_speedup", rows)
    return {
        "corpus": str(corpus.root), "records_in_corpus": len(corpus.records), "selected": len(records),
        "judged": len(rows), "not_judged_yet": len(records) - len(rows),
        "skipped": corpus.skipped, "mapping_conflicts": corpus.conflicts,
        "settings": settings, "near_factor": near_factor,
        "overall": share(rows), "per_level": per_level,
        "rules": [{"rule": name, "class": cls, "count": n} for (name, cls), n in sorted(
            rule_counts.items(), key=lambda kv: (-kv[1], kv[0]))],
        "reviewed": sum(x["reviewed"] for x in rows),
        "rejections": [x for x in rows if not x["correct"] or x["class"] != "correct"],
        "correlation": correlation,
        "ncu": ncu, "ncu_note": ncu_note,
        "markers": marker_summary({r.key: (results[r.key].get("verdict") or {}) for r in records if r.key in results}),
        "records": rows,
    }


def marker_summary(verdicts: dict[str, dict], over: float = 1.02) -> dict:
    """How the judge's gated times of correct verdicts sit against their own end markers.

    A gated call's time is its start-to-end-marker time (`stream_ms`) unless the device looked busy
    past the end marker (side-stream work, or an idle marker made late by the host: timing.py
    `device_busy_ms`). Counted over the timed calls: how many were read past their end marker, and
    of those how many had the timing thread wait for a core meanwhile (`run_delay_ms`); listed: the
    verdicts whose runtime is more than `over` times the median end-marker time of the calls it
    was taken from (the last `runtime.n` timed calls), and whether that was the second round."""
    calls = past = waited = 0
    stretched = []
    for key, v in sorted(verdicts.items()):
        runtime = v.get("runtime") or {}
        if not v.get("correct") or runtime.get("source") != "gated":
            continue
        timed = [c for c in v.get("calls") or [] if c.get("role") == "timed"]
        timed = timed[-int(runtime.get("n") or len(timed)):]
        gated = [c for c in timed if c.get("stream_ms") is not None and c.get("inside_ms") is not None]
        for c in gated:
            calls += 1
            if c["inside_ms"] > c["stream_ms"] * 1.0001 + 1e-6:
                past += 1
                waited += (c.get("run_delay_ms") or 0.0) > 0.001
        if gated and runtime.get("median_ms"):
            ratio = runtime["median_ms"] / statistics.median(c["stream_ms"] for c in gated)
            if ratio > over:
                stretched.append({"key": key, "ratio": ratio,
                                  "second_round": any("second round" in n for n in v.get("notes") or [])})
    return {"gated_timed_calls": calls, "past_end_marker": past, "past_end_marker_waited": waited,
            "over": over, "stretched": stretched}


def compare_runs(mine: dict[str, dict], other: dict[str, dict], close: float = 0.005) -> dict:
    """The records both folders judged (`--compare`): whether the verdicts agree, and how the
    runtimes of those judged correct in both compare (this run's over the other's): the median
    ratio, how many agree within `close`, and the others by key, with how each was timed."""
    both = sorted(set(mine) & set(other))
    verdict = {k: ((mine[k].get("verdict") or {}), (other[k].get("verdict") or {})) for k in both}
    differ = [k for k, (a, b) in verdict.items() if bool(a.get("correct")) != bool(b.get("correct"))]
    ratios, apart = [], []
    for k, (a, b) in verdict.items():
        ra, rb = (a.get("runtime") or {}), (b.get("runtime") or {})
        if a.get("correct") and b.get("correct") and ra.get("median_ms") and rb.get("median_ms"):
            ratio = ra["median_ms"] / rb["median_ms"]
            ratios.append(ratio)
            if abs(ratio - 1) > close:
                apart.append({"key": k, "ratio": ratio, "ms": ra["median_ms"], "other_ms": rb["median_ms"],
                              "source": ra.get("source"), "other_source": rb.get("source")})
    return {"both": len(both), "verdicts_differ": differ, "timed_both": len(ratios),
            "median_ratio": statistics.median(ratios) if ratios else None, "close": close,
            "within_close": len(ratios) - len(apart), "apart": sorted(apart, key=lambda x: -abs(x["ratio"] - 1))}


def compare_sentence(c: dict) -> str:
    return (f"{c['both']} records judged in both runs, {len(c['verdicts_differ'])} with another verdict; of the "
            f"{c['timed_both']} correct in both, {c['within_close']} runtimes within {100 * c['close']:g}% "
            f"(median ratio {_fmt(c['median_ratio'], 4)})")


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.0f}"
    return str(x)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown(report: dict) -> str:
    o = report["overall"]
    lines = ["# Fidelity: the judge on the KernelBench leaderboard corpus", "",
             f"Corpus `{report['corpus']}`: {report['records_in_corpus']} records paired with a reference, "
             f"{report['selected']} selected, {report['judged']} judged. Judge: {report['settings']['summary']}.",
             ""]
    if report["skipped"]:
        lines += [f"Records not paired with a reference: {len(report['skipped'])}.", ""]
    if report["mapping_conflicts"]:
        lines += [f"data.json and problem_id disagree on {len(report['mapping_conflicts'])} records.", ""]
    lines += ["## Judged correct", "", "| level | judged | correct | share | solution_error | hack | "
              "policy_difference | judge_problem |", "|---|---|---|---|---|---|---|---|"]
    for name, s in list(report["per_level"].items()) + [("all", o)]:
        c = s["classes"]
        lines.append(f"| {name} | {s['judged']} | {s['correct']} | {_pct(s['share'])} | {c['solution_error']} | "
                     f"{c['hack']} | {c['policy_difference']} | {c['judge_problem']} |")
    lines += ["", summary_sentence(o)]
    lines += ["", "## Rules", "", "| rule | class | count |", "|---|---|---|"]
    lines += [f"| {x['rule']} | {x['class']} | {x['count']} |" for x in report["rules"]]
    if report["reviewed"]:
        lines += ["", f"{report['reviewed']} records classified by review (--explain) instead of the rules."]
    lines += ["", "## Speed-up vs eager: judge against the leaderboard's torch_speedup", "",
              "| scope | pairs | Spearman | geomean judge/recorded |", "|---|---|---|---|"]
    corr = report["correlation"]
    for name, c in [("all", corr["overall"])] + [(f"level {k}", v) for k, v in corr["per_level"].items()]:
        lines.append(f"| {name} | {c['n']} | {_fmt(c['spearman'])} | {_fmt(c['geomean_judge_over_recorded'])} |")
    if "vs_compile" in corr:
        c = corr["vs_compile"]
        lines.append(f"| vs torch.compile | {c['n']} | {_fmt(c['spearman'])} | "
                     f"{_fmt(c['geomean_judge_over_recorded'])} |")
    if report["ncu"] is not None or report["ncu_note"]:
        lines += ["", "## Nsight Compute: summed gpu__time_duration per forward beside the judge's runtime", ""]
        if report["ncu_note"]:
            lines += [report["ncu_note"], ""]
        if report["ncu"]:
            lines += ["| record | judge ms | ncu ms | judge/ncu | kernels/forward | note |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {x['key']} | {_fmt(x['judge_ms'])} | {_fmt(x['ncu_ms'])} | {_fmt(x['ratio'])} | "
                      f"{_fmt(x['kernels_per_forward'])} | {_ncu_row_note(x)} |" for x in report["ncu"]]
    c = report.get("compare")
    if c:
        lines += ["", f"## Against another run ({c['folder']})", "", compare_sentence(c)]
        if c["verdicts_differ"]:
            lines += ["", "Other verdicts: " + ", ".join(c["verdicts_differ"])]
        if c["apart"]:
            lines += ["", "| record | ms | other ms | ratio | timed | other timed |", "|---|---|---|---|---|---|"]
            lines += [f"| {x['key']} | {_fmt(x['ms'], 4)} | {_fmt(x['other_ms'], 4)} | {_fmt(x['ratio'])} | "
                      f"{x['source']} | {x['other_source']} |" for x in c["apart"]]
    m = report.get("markers")
    if m and m["gated_timed_calls"]:
        lines += ["", "## Gated times against their end markers", "", marker_sentence(m)]
        if m["stretched"]:
            lines += ["", "| record | runtime / end-marker time | second round |", "|---|---|---|"]
            lines += [f"| {x['key']} | {_fmt(x['ratio'])} | {'yes' if x['second_round'] else 'no'} |"
                      for x in m["stretched"]]
    lines += ["", "## Records not judged correct", "", "| record | class | rule | category | message |",
              "|---|---|---|---|---|"]
    for x in report["rejections"]:
        msg = x["message"].replace("|", "\\|")
        lines.append(f"| {x['key']} | {x['class']}{' (reviewed)' if x['reviewed'] else ''} | {x['rule']} | "
                     f"{x['category']} | {msg} |")
    return "\n".join(lines) + "\n"


def marker_sentence(m: dict) -> str:
    return (f"{m['past_end_marker']} of {m['gated_timed_calls']} gated timed calls of correct verdicts were timed "
            f"past their end marker ({m['past_end_marker_waited']} of them with the timing thread waiting for a "
            f"core meanwhile); {len(m['stretched'])} runtimes over {m['over']:g}x their calls' median "
            f"end-marker time.")


def summary_sentence(o: dict) -> str:
    """The overall shares in one sentence: judged correct, then what the rest comes down to."""
    c = o["classes"]
    return (f"{o['correct']} of {o['judged']} judged correct ({_pct(o['share'])}); counting the "
            f"{c['policy_difference']} refused by a documented policy difference as agreement, "
            f"{_pct(o.get('share_with_policy'))}; {c['judge_problem']} judge problems, so "
            f"{_pct(o.get('share_no_judge_problem'))} of the verdicts are correct or explained by the solution "
            f"or the policy.")


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal and console.width < 160:
        console.width = 160
    t = Table(title=f"judged correct ({report['settings']['summary']})")
    for col in ("level", "judged", "correct", "share") + CLASSES:
        t.add_column(col, justify="right" if col != "level" else "left")
    for name, s in list(report["per_level"].items()) + [("all", report["overall"])]:
        t.add_row(name, str(s["judged"]), str(s["correct"]), _pct(s["share"]),
                  *(str(s["classes"][c]) for c in CLASSES))
    console.print(t)
    console.print(summary_sentence(report["overall"]))
    rt = Table(title="rules")
    for col in ("rule", "class", "count"):
        rt.add_column(col)
    for x in report["rules"]:
        rt.add_row(x["rule"], x["class"], str(x["count"]))
    console.print(rt)
    if report["rejections"]:
        xt = Table(title="records not judged correct")
        for col in ("record", "class", "rule", "category", "message"):
            xt.add_column(col, overflow="fold")
        for x in report["rejections"]:
            xt.add_row(x["key"], x["class"] + (" (reviewed)" if x["reviewed"] else ""), x["rule"], x["category"],
                       x["message"])
        console.print(xt)
    c = report["correlation"]["overall"]
    console.print(f"Spearman (judge speed-up vs recorded torch_speedup): {_fmt(c['spearman'])} over {c['n']} "
                  f"records correct on both sides; geomean judge/recorded {_fmt(c['geomean_judge_over_recorded'])}")
    c = report.get("compare")
    if c:
        console.print(f"against {c['folder']}: " + compare_sentence(c) + "".join(
            f"\n  {x['key']}: {_fmt(x['ms'], 4)} vs {_fmt(x['other_ms'], 4)} ms ({_fmt(x['ratio'])}x)"
            for x in c["apart"]))
    m = report.get("markers")
    if m and m["gated_timed_calls"]:
        console.print(marker_sentence(m) + "".join(f"\n  {x['key']}: {_fmt(x['ratio'])}x"
                                                   + (" (second round)" if x["second_round"] else "")
                                                   for x in m["stretched"]))
    if report["ncu_note"]:
        console.print(report["ncu_note"])
    for x in report["ncu"] or []:
        note = _ncu_row_note(x)
        console.print(f"ncu {x['key']}: judge {_fmt(x['judge_ms'])} ms, kernels {_fmt(x['ncu_ms'])} ms per forward, "
                      f"ratio {_fmt(x['ratio'])}" + (f" ({note})" if note else ""))
