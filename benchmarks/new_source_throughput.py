"""New-source throughput: published single-file solutions judged from a cold cache, per GPU-hour
(the run and its report: `cuda_agent.fidelity.new_source`, whose docstring says what is measured).

    python benchmarks/new_source_throughput.py --corpus CORPUS/docs/assets --out nst-h100 --sample 80
    python benchmarks/new_source_throughput.py --out nst-h100 --report-only
"""

import sys

from cuda_agent.fidelity.new_source import main

if __name__ == "__main__":
    sys.exit(main())
