"""Classification of rejections by explicit rules, and the static pre-screen (no device)."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .corpus import CLASSES, Record, UsageError, read_json


@dataclass(frozen=True)
class Rule:
    """One explicit rule: matches a result whose failure category (or pool/judge error kind) is one of
    `kinds` and whose message matches `pattern` (when given) and `test` (when given)."""

    name: str
    cls: str
    kinds: tuple[str, ...]
    reason: str
    pattern: str | None = None
    test: object = None           # callable(message, config dict) -> bool

    def matches(self, kind: str, message: str, config: dict) -> bool:
        if kind not in self.kinds:
            return False
        if self.pattern and not re.search(self.pattern, message, re.I | re.S):
            return False
        return self.test is None or bool(self.test(message, config))


NEAR_FACTOR = 10.0  # an error within this factor of the bound is "just above it", not a wrong kernel

_ELEMENTWISE = re.compile(r"values outside atol=([0-9.eE+-]+), rtol=([0-9.eE+-]+) "
                         r"\(max abs error ([0-9.eE+-]+|inf|nan)")
_NORMWISE = re.compile(r"relative L2 error ([0-9.eE+-]+|inf|nan) (?:against the float64 reference )?exceeds "
                       r"(?:the bound )?([0-9.eE+-]+)")
# The noise-scaled bound's message: the error, the bound, and the float32 reference's own error
# against float64 (its rounding noise), from `cuda_agent.judge.compare`.
# (Older verdicts write the bound as clamp(M x NOISE, FLOOR, CEILING), newer ones as
# min(max(FLOOR, M x NOISE), CEILING + NOISE) or min(max(FLOOR, M x NOISE), CEILING + K x NOISE).)
_NOISE = re.compile(r"relative L2 error ([0-9.eE+-]+) against the float64 reference exceeds the bound "
                    r"([0-9.eE+-]+) = (?:clamp\(|min\(max\([0-9.eE+-]+, )[0-9.eE+-]+ x ([0-9.eE+-]+)[,)]")
KERNELBENCH_TOL = 1e-2   # KernelBench's atol = rtol: what the leaderboard accepted
APPROX_FACTOR = 1000.0   # an error this many times the reference's own rounding noise is no reordering


def approximation(message: str, config: dict) -> bool:
    """A mismatch far beyond the reference's own float32 rounding noise (no reordering of the same
    arithmetic gets there) yet within KernelBench's tolerance: a different, approximate computation
    (a tanh GELU for the exact one, say) that the leaderboard accepted and the judge's fp32 bound
    refuses by design."""
    m = _NOISE.search(message)
    if not m:
        return False
    err, noise = float(m[1]), float(m[3])
    return math.isfinite(err) and err <= KERNELBENCH_TOL and err > APPROX_FACTOR * max(noise, 1e-12)


def near_tolerance(message: str, config: dict) -> bool:
    """Whether a mismatch is only just outside the judge's bound (a tolerance question, not a bug):
    the max abs error within NEAR_FACTOR x atol, or the relative L2 error within NEAR_FACTOR x its bound."""
    factor = float(config.get("near_factor", NEAR_FACTOR))
    m = _ELEMENTWISE.search(message)
    if m:
        atol, err = float(m[1]), float(m[3])
        return math.isfinite(err) and err <= factor * atol
    m = _NORMWISE.search(message)
    if m:
        err, bound = float(m[1]), float(m[2])
        return math.isfinite(err) and err <= factor * bound
    return False


# First match wins. Kinds are the verdict's failure categories, or for results without a verdict
# the error kind: judge_error (JudgeError: baseline failed, reference unusable), pool_error (the pool
# or its transport), task_error (the reference file could not be read as a task).
RULES: tuple[Rule, ...] = (
    Rule("pool-error", "judge_problem", ("pool_error",), "the pool or its transport could not judge it"),
    Rule("baseline-failed", "judge_problem", ("judge_error",), "the judge's baseline of the reference failed",
         pattern=r"baseline failed"),
    Rule("reference-unusable", "judge_problem", ("judge_error", "task_error"),
         "the judge could not use the reference task"),
    Rule("judge-error", "judge_problem", ("judge",), "the judge itself broke"),
    Rule("pool-time-limit", "judge_problem", ("timeout",), "the pool's time limit on a judge worker, not a call",
         pattern=r"pool's time limit"),
    Rule("load-time-limit", "judge_problem", ("timeout",),
         "loading the module and constructing ModelNew outran the judge's limit (builds have their own)",
         pattern=r"loading the candidate did not finish"),
    Rule("call-timeout", "solution_error", ("timeout",), "a call of the solution outran the per-call limit"),
    Rule("build-time-limit", "judge_problem", ("compile_timeout",), "the build outran the judge's build limit"),
    Rule("build-flags", "judge_problem", ("compile",), "the judge refused the solution's compiler flags",
         pattern=r"flags not allowed"),
    Rule("wrong-backend", "judge_problem", ("compile",), "CUDA sources judged on the CPU backend",
         pattern=r"CUDA sources cannot be built for the CPU backend"),
    Rule("removed-torch-api", "solution_error", ("compile",),
         "uses a PyTorch C++ API the installed PyTorch no longer has (Tensor::type() given to AT_DISPATCH_*, "
         "deprecated since 1.x): it compiled against the leaderboard's older PyTorch",
         pattern=r"DeprecatedTypeProperties"),
    Rule("compile-error", "solution_error", ("compile",), "the solution's code does not compile"),
    Rule("reference-fallback", "hack", ("policy",), "ModelNew falls back on the reference Model",
         pattern=r"must derive from nn\.Module, not|reference Model may not be used"),
    Rule("clone-pattern", "judge_problem", ("policy",),
         "the C++ check's thread pattern matches a tensor's .clone(); a clone syscall is refused at link time anyway",
         pattern=r"threads \('clone\('\) is not allowed"),
    Rule("input-as-a-name", "judge_problem", ("policy",),
         "'input' refused as a name: published code names forward's argument so; the builtin reads stdin",
         pattern=r"use of 'input' is not allowed"),
    Rule("policy-refusal", "policy_difference", ("policy",),
         "refused by the judge's policy (KernelBench has no such rule)"),
    Rule("tampering", "hack", ("tampering",), "the solution changed the judge's state or files"),
    Rule("input-mutation", "policy_difference", ("mismatch",),
         "the judge refuses in-place changes to inputs; KernelBench does not check them",
         pattern=r"modified input \d+ in place"),
    Rule("lower-precision", "policy_difference", ("mismatch",),
         "lower-precision arithmetic (fp16, bf16 or TF32 operands or outputs) within KernelBench's 1e-2: the "
         "judge's precision probe found the output's response to a small change of the inputs lost in rounding",
         pattern=r"lower precision than the task(, not an approximation| on the calls after)"),
    Rule("approximation", "policy_difference", ("mismatch",),
         "an approximate computation: over 1000x the reference's own float32 rounding error, within "
         "KernelBench's 1e-2 tolerance; the judge's float32 bound refuses lower precision than the task",
         test=approximation),
    Rule("near-tolerance", "judge_problem", ("mismatch",), "error just above the judge's bound (within 10x)",
         test=near_tolerance),
    Rule("wrong-results", "solution_error", ("mismatch",), "wrong results far outside tolerance, shape or dtype"),
    Rule("timing-disagreement", "judge_problem", ("timing",),
         "the outside clock disagreed with the call's own: on published code, a noisy host more likely than a hack"),
    Rule("reading-back-inputs", "judge_problem", ("runtime",), "reading back the inputs failed",
         pattern=r"reading back the inputs failed"),
    Rule("memory-limit", "judge_problem", ("oom", "resource"),
         "the judge's memory or disk limit (the leaderboard ran it within its own)"),
    Rule("unsupported-build-call", "judge_problem", ("load", "init", "runtime"),
         "the judge does not support this way of building (extra_include_paths, cpp_extension.load)",
         pattern=r"is not supported by the judge|only load_inline \(or a workspace\) can build extensions"),
    Rule("raised-or-crashed", "solution_error", ("load", "init", "runtime", "crash"),
         "the solution raised or crashed (load, construction or forward)"),
)
FALLBACK = Rule("unclassified", "judge_problem", (), "no rule matched: needs a person's review")


def result_kind_and_message(entry: dict) -> tuple[str, str]:
    if entry.get("error"):
        return str(entry["error"].get("kind", "judge_error")), str(entry["error"].get("message", ""))
    v = entry.get("verdict") or {}
    failure = v.get("failure") or {}
    return str(failure.get("category", "judge")), str(failure.get("message", ""))


def classify(entry: dict, config: dict) -> tuple[str, str, str]:
    """(class, rule name, reason) of a result; class 'correct' for a verdict judged correct."""
    v = entry.get("verdict")
    if v and v.get("correct"):
        return "correct", "correct", "judged correct"
    kind, message = result_kind_and_message(entry)
    for rule in RULES:
        if rule.matches(kind, message, config):
            return rule.cls, rule.name, rule.reason
    return FALLBACK.cls, FALLBACK.name, FALLBACK.reason


def load_explain(path: Path | None) -> dict[str, dict]:
    if path is None:
        return {}
    data = read_json(path, dict, "an object mapping record keys to {class, reason}", label=f"--explain {path}")
    out = {}
    for key, value in data.items():
        if isinstance(value, str):
            value = {"class": value}
        if not isinstance(value, dict) or value.get("class") not in CLASSES:
            raise UsageError(f"--explain {path}: {key}: class must be one of {', '.join(CLASSES)} "
                             "(a refusal the judge should not have made is a judge_problem)")
        out[key] = {"class": value["class"], "reason": str(value.get("reason", "reviewed"))}
    return out


def first_line(text: str, kind: str = "") -> str:
    """The line of a failure message that says what happened: the first one, except the first
    compiler error of a build log and the last line (the exception) of a traceback."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    if kind in ("compile", "compile_timeout"):
        line = next((x for x in lines if re.search(r"\berror\b", x, re.I)), lines[0])
    elif lines[0].startswith("Traceback (most recent call last)"):
        line = lines[-1]
    else:
        line = lines[0]
    return line[:240]


# ---------------------------------------------------------------------------------------------
# Static pre-screen (no device)

def prescreen_record(code: str, policy: str) -> list[tuple[str, str]]:
    """What the judge would refuse before running anything, as (failure category, message) in the
    judge's own words: the Python policy, the compiler flags and the C++ policy of every load_inline
    call whose arguments are literals (or module-level names bound to literals). An approximation
    of the judge's checks, which see the arguments load_inline is really called with."""
    import ast

    from cuda_agent.judge import policy as pol
    from cuda_agent.judge.builds import check_flags
    from cuda_agent.judge.builds import static_load_inline_calls
    from cuda_agent.judge.inline_request import load_inline_request

    def strings(value) -> list[str]:
        return [value] if isinstance(value, str) else [str(x) for x in value or []]

    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return [("load", f"model_new: syntax error at line {exc.lineno}: {exc.msg}")]
    found = [("policy", v) for v in pol.check_python(code, policy)]
    # the judge's own reader of load_inline calls (the compile workers' plan): calls whose
    # arguments it cannot read statically are checked by the judge when they run, not here
    for _, args in static_load_inline_calls(tree, []):
        try:
            request = load_inline_request(*args.args, **args.kwargs)
        except RuntimeError as exc:  # what the worker's stand-in raises (extra_include_paths)
            found.append(("load", f"RuntimeError: {exc}"))
            continue
        bad = check_flags(strings(request["cflags"]) + strings(request["cuda_cflags"]) + strings(request["ldflags"]))
        if bad:
            found.append(("compile", f"compiler/linker flags not allowed: {' '.join(bad)}"))
        for key, file in (("cpp_sources", "main.cpp"), ("cuda_sources", "cuda.cu")):
            for src in strings(request[key]):
                found += [("policy", v) for v in pol.check_cpp(src, f"{request['name']}/{file}", policy)]
    return found


def prescreen(records: list[Record], policy: str, near_factor: float) -> dict:
    rows = []
    for r in records:
        found = prescreen_record(r.code, policy)
        if not found:
            continue
        entries = []
        for kind, message in found:
            cls, rule, reason = classify({"verdict": {"correct": False, "failure": {
                "category": kind, "message": message}}}, {"near_factor": near_factor})
            entries.append({"class": cls, "rule": rule, "category": kind, "message": first_line(message, kind)})
        rows.append({"key": r.key, "level": r.level, "findings": entries})
    first = Counter((x["findings"][0]["rule"], x["findings"][0]["class"]) for x in rows)
    every = Counter((f["rule"], f["class"]) for x in rows for f in {(f["rule"], f["class"]): f
                                                                    for f in x["findings"]}.values())
    return {"policy": policy, "records": len(records), "refused": len(rows),
            "first_finding": [{"rule": k[0], "class": k[1], "count": n} for k, n in first.most_common()],
            "any_finding": [{"rule": k[0], "class": k[1], "count": n} for k, n in every.most_common()],
            "list": rows}


def prescreen_markdown(pre: dict) -> str:
    lines = ["# Static pre-screen: what the judge refuses before running anything", "",
             f"{pre['refused']} of {pre['records']} records ({pre['policy']} policy). The judge stops at its "
             "first finding; a record can have several.", "",
             "| rule | class | records (first finding) | records (any finding) |", "|---|---|---|---|"]
    anyf = {(x["rule"], x["class"]): x["count"] for x in pre["any_finding"]}
    firstf = {(x["rule"], x["class"]): x["count"] for x in pre["first_finding"]}
    for k in sorted(anyf, key=lambda k: -anyf[k]):
        lines.append(f"| {k[0]} | {k[1]} | {firstf.get(k, 0)} | {anyf[k]} |")
    lines += ["", "| record | class | rule | message |", "|---|---|---|---|"]
    for x in pre["list"]:
        f = x["findings"][0]
        lines.append(f"| {x['key']} | {f['class']} | {f['rule']} | {f['message'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"
