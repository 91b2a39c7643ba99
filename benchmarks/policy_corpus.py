"""What the judge's source checks say about real published code, before any build or run: the
leaderboard corpus, the bundled suite's solutions and the honest test fixtures under both policies
(`cuda_agent.fidelity.policy_corpus`). Run it before and after a policy change and compare.

    python benchmarks/policy_corpus.py --corpus .corpus --out before.json
    (change the policy)
    python benchmarks/policy_corpus.py --corpus .corpus --out after.json --compare before.json

Exit status: 0, or 1 with --compare when any verdict differs.
"""

import sys
from pathlib import Path

from cuda_agent.fidelity.policy_corpus import main

if __name__ == "__main__":
    sys.exit(main(fixtures=Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
