"""The agent's `profile` tool on every bundled workspace solution, the judge's runtime beside Nsight
Compute's kernel time (CUDA; what it reports: `cuda_agent.measure.profile`).

    python benchmarks/profile_suite.py --out runs/profile
    python benchmarks/profile_suite.py --only 3_Softmax_Rows --out runs/profile
"""

import sys

from cuda_agent.measure.profile import main

if __name__ == "__main__":
    sys.exit(main())
