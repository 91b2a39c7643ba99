"""Does the judge accept real published kernels? The KernelBench leaderboard corpus, judged.

The corpus is the public KernelBench leaderboard (anneouyang/KernelBenchLeaderboard), its
`docs/assets/` folder: `raw_data.json` (one record per published solution: `level`, `problem_id`,
`code` - a `load_inline` ModelNew module -, `model`, `torch_speedup`, `baseline_torch_time`,
`kernel_eval_time`, ...), `problems/l{level}_p{N}.py` (the reference tasks) and `data.json`
("Level L: N_Name" -> the records of that problem, by `file`). A record's `problem_id` counts from
0: its reference is `problems/l{level}_p{problem_id + 1}.py`; where `data.json` names the record,
the number in that name decides (and a disagreement is reported).

    cuda-agent fidelity --corpus CORPUS/docs/assets --out fidelity-h200
    cuda-agent fidelity --corpus ... --out ... --sample 60 --seed 1 --ncu-sample 8
    cuda-agent fidelity --corpus ... --out ... --time-budget 8     # again until all are judged
    cuda-agent fidelity --corpus ... --out ... --report-only --explain benchmarks/fidelity_reviewed.json
    cuda-agent fidelity --corpus ... --out ... --prescreen       # static checks only, no device
    cuda-agent fidelity --corpus ... --out ... --rejudge 'l3_p15_*'  # after a judge fix
    cuda-agent fidelity --corpus ... --out ... --report-only --compare OTHER_OUT  # a repeat

1. Every record (or a sample stratified by level) is paired with its reference and judged through
   the project's pool (`cuda_agent.pool`), by default on CUDA with the lenient policy (published
   solutions use torch glue) and no torch.compile baseline. Each result is appended to
   `OUT/verdicts.jsonl` as it arrives: a rerun judges only the records that file lacks
   (`--rejudge GLOB` takes the matching records' verdicts out first, so they are judged again).
2. The share judged correct, overall and per level; every rejection is classified by explicit
   rules over the verdict's failure category and message (`rules.RULES`) into `solution_error`,
   `hack`, `policy_difference` or `judge_problem`; `--explain FILE` (JSON: record key -> {"class",
   "reason"}) overrides the rules for refusals a person has reviewed (`fidelity_reviewed.json`: the
   ones whose source shows a cause the rules cannot see, such as eval-mode BatchNorm in a training-
   mode task); a review never turns a pass into anything else.
3. Spearman's rank correlation of the judge's speed-up over eager with the leaderboard's recorded
   `torch_speedup`, over the records judged correct on both sides.
4. `--ncu-sample K` (CUDA, `ncu` on PATH): K correct solutions are run under Nsight Compute in a
   trusted subprocess outside the judge (`python -m cuda_agent.fidelity.ncu_runner`: build ModelNew from the
   reference's init inputs, flush L2 between calls, profile a few forwards) and the summed
   `gpu__time_duration` per forward is set beside the judge's runtime of the same candidate. Their
   extensions are built first, `--ncu-build-parallel` at once, each in a folder of its own; the
   profiled runs, one at a time, then only load them.
5. `OUT/fidelity.json` (every figure, every record) and `OUT/fidelity.md` (the tables).

Exit codes: 0 the report was written; 2 usage error (missing corpus, bad options, an output folder
judged with other settings); 3 the judge could not run (no such device, the pool broke).
"""

from .corpus import (CLASSES, RUN_FILE, VERDICTS_FILE, Corpus, Record, UsageError, append_result,
                     check_run_settings, corpus_root, forget_results, interleaved, load_corpus, names_by_file,
                     read_results, stratified_sample)
from .judging import judge_records, settings_of
from .ncu import ncu_reading, parse_ncu_csv, prebuild_ncu, run_ncu
from .report import (build_report, compare_runs, compare_sentence, geomean, markdown, marker_sentence,
                     marker_summary, print_report, rankdata, spearman, summary_sentence)
from .rules import NEAR_FACTOR, RULES, Rule, classify, first_line, load_explain, prescreen, prescreen_markdown
from .run import EXIT_JUDGE, EXIT_USAGE, FidelityOptions, run

__all__ = ["CLASSES", "EXIT_JUDGE", "EXIT_USAGE", "NEAR_FACTOR", "RULES", "RUN_FILE", "VERDICTS_FILE", "Corpus",
           "FidelityOptions", "Record", "Rule", "UsageError", "append_result", "build_report", "check_run_settings",
           "classify", "compare_runs", "compare_sentence", "corpus_root", "first_line", "forget_results", "geomean",
           "interleaved", "judge_records", "load_corpus", "load_explain", "markdown", "marker_sentence",
           "marker_summary", "names_by_file", "ncu_reading", "parse_ncu_csv", "prebuild_ncu", "prescreen",
           "prescreen_markdown", "print_report", "rankdata", "read_results", "run", "run_ncu", "settings_of",
           "spearman", "stratified_sample", "summary_sentence"]
