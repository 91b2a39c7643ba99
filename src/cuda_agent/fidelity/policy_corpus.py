"""What the judge's source checks say about real published code, before any build or run.

Reads the KernelBench leaderboard corpus (`docs/assets/raw_data.json` of the public repository
anneouyang/KernelBenchLeaderboard, copied to a folder you give) and runs the static policy on every
solution under both policies: the Python check on the module, the C++ check on each string that
reads as C++ or CUDA source (what `load_inline` would be given). The bundled suite's solutions and
the honest test fixtures are read too. A policy change should leave honest code alone: run this
before and after it and compare.

    python benchmarks/policy_corpus.py --corpus .corpus --out before.json
    (change the policy)
    python benchmarks/policy_corpus.py --corpus .corpus --out after.json --compare before.json

Exit status: 0, or 1 with --compare when any verdict differs.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

from cuda_agent.judge import policy

SUITE = Path(__file__).resolve().parent.parent / "suite" / "solutions"
CPP_HINTS = ("torch::", "__global__", "#include", "at::Tensor", "TORCH_CHECK")


def cpp_strings(source: str) -> list[str]:
    """The string constants of a Python module that read as C++/CUDA source."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and any(h in n.value for h in CPP_HINTS)]


def check_module(source: str, pol: str) -> list[str]:
    try:
        found = policy.check_python(source, pol)
    except SyntaxError as exc:
        found = [f"syntax error: {exc.msg}"]
    for i, text in enumerate(cpp_strings(source)):
        found += policy.check_cpp(text, f"source{i}", pol)
    return found


def items(corpus: Path | None, fixtures: Path | None = None):
    """(name, kind, text): corpus solutions, the bundled suite's solution files and, from a source
    checkout (`fixtures`: its tests/fixtures), the honest fixtures."""
    if corpus is not None:
        raw = json.loads((corpus / "raw_data.json").read_text())
        for r in raw:
            yield f"l{r['level']}_p{r['problem_id'] + 1}_{r['model']}", "py", r.get("code") or ""
    for path in sorted(SUITE.rglob("*")):
        if path.suffix in (".py", ".cu", ".cpp", ".h", ".cuh"):
            yield f"suite/{path.relative_to(SUITE)}", "py" if path.suffix == ".py" else "cpp", path.read_text()
    for path in sorted(fixtures.glob("*/honest/**/*")) if fixtures is not None else []:
        if path.suffix in (".py", ".cu", ".cpp", ".h", ".cuh"):
            yield f"fixtures/{path.relative_to(fixtures)}", "py" if path.suffix == ".py" else "cpp", path.read_text()


def main(argv: list[str] | None = None, fixtures: Path | None = None) -> int:
    """The command line of benchmarks/policy_corpus.py (`fixtures`: a checkout's tests/fixtures)."""
    ap = argparse.ArgumentParser(prog="benchmarks/policy_corpus.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--corpus", type=Path, help="folder holding the leaderboard's raw_data.json (optional)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file of every verdict, for a later --compare")
    ap.add_argument("--compare", type=Path, help="an earlier --out file: print what differs")
    args = ap.parse_args(argv)
    if args.corpus is not None and not (args.corpus / "raw_data.json").is_file():
        ap.error(f"{args.corpus}/raw_data.json not found")

    verdicts: dict[str, list[str]] = {}
    for name, kind, text in items(args.corpus, fixtures):
        for pol in ("strict", "lenient"):
            verdicts[f"{name}:{pol}"] = check_module(text, pol) if kind == "py" else policy.check_cpp(text, name, pol)
    args.out.write_text(json.dumps(verdicts, indent=1, sort_keys=True))

    for pol in ("strict", "lenient"):
        keys = [k for k in verdicts if k.endswith(f":{pol}")]
        refused = [k for k in keys if verdicts[k]]
        print(f"{pol}: {len(refused)} of {len(keys)} refused by the source checks")
        reasons = Counter(v.split(": ", 1)[-1].split(" (")[0][:90] for k in refused for v in verdicts[k][:1])
        for reason, n in reasons.most_common(8):
            print(f"  {n:4d}  {reason}")
    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text())
    differ = sorted(k for k in verdicts.keys() | before.keys() if verdicts.get(k) != before.get(k))
    print(f"{len(differ)} verdicts differ from {args.compare}")
    for k in differ[:40]:
        print(f"  {k}\n    before: {before.get(k)}\n    now:    {verdicts.get(k)}")
    return 1 if differ else 0
