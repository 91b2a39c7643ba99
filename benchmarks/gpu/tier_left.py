"""Which GPU tests are still to run, from the -v logs of earlier GPU-tier runs on this machine.

    python benchmarks/gpu/tier_left.py LOG... [--failed]

Prints one pytest node id a line: the GPU tests (`pytest -m gpu`, collected here) that no log
reports an outcome of, or with --failed those whose last reported outcome was FAILED or ERROR.
`device_gpu.sh tiertests` keeps each run's log in .cache/tier-logs/ and reads them with this when
TIER_LEFT=1 (a tier split over several calls) or TIER_FAILED=1 (failures run again alone)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

OUTCOMES = "PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS"
# pytest -v writes "tests/x.py::t PASSED [ 10%]"; under xdist "[gw0] [ 10%] PASSED tests/x.py::t"
_BEFORE = re.compile(rf"\b({OUTCOMES}) (tests/\S+::\S+)")
_AFTER = re.compile(rf"(tests/\S+::\S+) ({OUTCOMES})\b")


def outcomes(texts: list[str]) -> dict[str, str]:
    """node id -> its last reported outcome, over the logs in order."""
    seen: dict[str, str] = {}
    for text in texts:
        found = [(m.start(), m.group(2), m.group(1)) for m in _BEFORE.finditer(text)]
        found += [(m.start(), m.group(1), m.group(2)) for m in _AFTER.finditer(text)]
        for _, node, outcome in sorted(found):
            seen[node] = outcome
    return seen


def gpu_tests() -> list[str]:
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p",
                          "no:cacheprovider", "tests"], capture_output=True, text=True)
    return [line.strip() for line in run.stdout.splitlines() if "::" in line]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="*", type=Path)
    p.add_argument("--failed", action="store_true", help="the tests whose last outcome was a failure")
    args = p.parse_args(argv)
    seen = outcomes([log.read_text(errors="replace") for log in args.logs if log.is_file()])
    if args.failed:
        ids = [node for node, outcome in seen.items() if outcome in ("FAILED", "ERROR")]
    else:
        ids = [node for node in gpu_tests() if node not in seen]
    if ids:
        print("\n".join(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
