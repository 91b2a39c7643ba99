#!/usr/bin/env bash
# Runs the GPU tier and the GPU benchmarks on a CUDA machine, in stages that fit one call each.
#   bash benchmarks/gpu/device_gpu.sh STAGE [OUT_DIR]
#   bash benchmarks/gpu/device_gpu.sh pair STAGE_ON_GPU0 STAGE_ON_GPU1 [OUT_DIR]
# Stages: smoke, tier (= prebuild+tiertests), pack-cache, timing, release, flush, timingdiag, keepplane, memdiag, plane,
# fidelity, newsource, steps, filestep, start, bench, hwtruth, throughput, synth, probe;
# A+B runs A, then B.
# `pair` runs two stages at once on a two-GPU machine, each on its own GPU and half of the cores
# (OUT_DIR/gpu0, OUT_DIR/gpu1), so each sees what a one-GPU machine with half the cores would.
# DEADLINE (seconds since the epoch) shortens the synth stage's generation to end before it.
# Installs wheels from ./.whl (packages the machine lacks, e.g. pydantic: benchmarks/gpu/device_wheels.sh
# fetches them) and this package in place.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
stage=${1:-smoke}
if [ "$stage" = pair ]; then out=${4:-${OUT:-runs/device}}; else out=${2:-${OUT:-runs/device}}; fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export CUDA_AGENT_CACHE=${CUDA_AGENT_CACHE:-$PWD/.cache/cuda_agent}
if [ -z "${SKIP_INSTALL:-}" ]; then
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl 2>&1 | grep -v WARN
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
fi
suite=src/cuda_agent/suite

case "$stage" in
  *+*)
    for s in ${stage//+/ }; do SKIP_INSTALL=1 bash "$0" "$s" "$out"; done
    ;;
  pair)
    cores=$(nproc); half=$((cores / 2))
    for g in 0 1; do
      s=$([ $g = 0 ] && echo "$2" || echo "$3")
      lo=$((g * half)); hi=$((lo + half - 1))
      ( export SKIP_INSTALL=1 CUDA_VISIBLE_DEVICES=$g CUDA_AGENT_CACHE=$PWD/.cache/gpu$g \
               CUDA_AGENT_WORK=/var/tmp/cuda-agent-gpu$g
        pin=""; command -v taskset >/dev/null && pin="taskset -c $lo-$hi"
        $pin bash "$0" "$s" "$out/gpu$g" > "$out/gpu$g.log" 2>&1 ) &
    done
    wait
    for g in 0 1; do echo "=== gpu$g"; cut -c1-600 "$out/gpu$g.log"; done
    ;;
  smoke)
    for name in 2_GELU 3_Softmax_Rows; do
      task=$(ls $suite/cuda/level*/$name.py | head -1)
      sol=$(ls -d $suite/solutions/cuda/$name* | head -1)
      timeout 300 cuda-agent eval --task "$task" --solution "$sol" --json --compile-mode none | tee -a "$out/smoke.jsonl"
    done
    ;;
  tier)
    # prebuild then tiertests; on a fresh machine the prebuild alone takes ~450 s (70 candidates,
    # 16 builds at once), so give each its own call there: `prebuild`, then `tiertests` on the
    # still-warm machine, which keeps the ignored cache folder between calls.
    SKIP_INSTALL=1 bash "$0" prebuild "$out"
    SKIP_INSTALL=1 bash "$0" tiertests "$out"
    ;;
  prebuild)
    # The CUDA fixtures and suite solutions are compiled first, many at once, into the cache the
    # test modules share (CUDA_AGENT_TEST_CACHE); the tests then judge them with few workers, since
    # the timing checks need the GPU mostly to themselves. A test that finds its build missing
    # compiles it itself, slowly, beside the others.
    export CUDA_AGENT_TEST_CACHE=${CUDA_AGENT_TEST_CACHE:-$PWD/.cache/test-cache}
    # A cache an earlier machine of the same kind built (`pack-cache`), carried in .test-cache/:
    # unpacked first, so only what changed since is compiled (the build keys decide).
    if ls .test-cache/test-cache.tgz.part-* >/dev/null 2>&1; then
      mkdir -p "$CUDA_AGENT_TEST_CACHE"
      cat .test-cache/test-cache.tgz.part-* | tar xzf - -C "$CUDA_AGENT_TEST_CACHE" --strip-components=1 \
        && echo "unpacked $(find "$CUDA_AGENT_TEST_CACHE" -name '*.so' | wc -l) cached builds from .test-cache"
    fi
    t0=$(date +%s)
    timeout ${PREBUILD_TIMEOUT:-540} cuda-agent build tests/fixtures/cuda/honest tests/fixtures/cuda/hacks \
      tests/fixtures/cuda/faults $suite/solutions/cuda --device cuda -j ${PREBUILD_PARALLEL:-16} --jobs 1 \
      -c cache_dir="$CUDA_AGENT_TEST_CACHE" > "$out/prebuild.log" 2>&1
    echo "prebuild rc=$? after $(( $(date +%s) - t0 )) s: $(tail -1 "$out/prebuild.log")"
    ;;
  pack-cache)
    # The test cache in parts the device tool brings back (16 MiB each): put them in .test-cache/
    # here (ignored by git) and carry that folder next time, for `prebuild` to unpack.
    tar czf - -C "$(dirname "${CUDA_AGENT_TEST_CACHE:-$PWD/.cache/test-cache}")" \
      "$(basename "${CUDA_AGENT_TEST_CACHE:-$PWD/.cache/test-cache}")" | split -b 15m - "$out/test-cache.tgz.part-"
    ls -la "$out"/test-cache.tgz.part-*
    ;;
  tiertests)
    # One folder for every call on the same machine, so a rerun (a warm machine keeps ignored
    # files) finds the builds of the last one. TIER_ARGS: which tests (default: all of tests/);
    # TIER_K: a pytest -k expression (spaces allowed) to run part of them. A tier longer than one
    # call: each run's log is kept in .cache/tier-logs/, and TIER_LEFT=1 runs only the GPU tests no
    # earlier run on this machine reported (tier_left.py); TIER_FAILED=1 runs the failed ones
    # again, one at a time (TIER_WORKERS=1 unless set).
    export CUDA_AGENT_TEST_CACHE=${CUDA_AGENT_TEST_CACHE:-$PWD/.cache/test-cache}
    # Each failure's report is written as it happens: a run cut by its time limit still says why.
    export CUDA_AGENT_FAILURE_LOG=$out/gpu_tier_failures.log
    t0=$(date +%s)
    logs=.cache/tier-logs; mkdir -p "$logs"
    tests=(${TIER_ARGS:-tests})
    if [ -n "${TIER_LEFT:-}${TIER_FAILED:-}" ]; then
      mapfile -t tests < <(python3 benchmarks/gpu/tier_left.py "$logs"/*.log ${TIER_FAILED:+--failed})
      [ -n "${TIER_FAILED:-}" ] && TIER_WORKERS=${TIER_WORKERS:-1}
      echo "${#tests[@]} GPU tests to run (${TIER_FAILED:+failed before}${TIER_LEFT:+not reported by earlier runs})"
    fi
    par=""
    python3 -c "import xdist" 2>/dev/null && [ "${TIER_WORKERS:-3}" -gt 1 ] && par="-n ${TIER_WORKERS:-3}"
    # -v: each test's outcome is on its own line as it ends, so a run cut by its time limit still
    # says which tests failed.
    if [ ${#tests[@]} -gt 0 ]; then
      timeout ${TIER_TIMEOUT:-540} python3 -m pytest -v -rfE -m gpu $par -p no:cacheprovider --durations=15 \
        ${TIER_K:+-k "$TIER_K"} "${tests[@]}" > "$out/gpu_tier.log" 2>&1
      echo "tier rc=$? after $(( $(date +%s) - t0 )) s"
      cp "$out/gpu_tier.log" "$logs/$(date +%s).log"
    fi
    grep -E "passed|failed|FAILED|ERROR|s call " "$out/gpu_tier.log" | cut -c1-300 | tail -60
    [ -s "$CUDA_AGENT_FAILURE_LOG" ] && grep -E "^(=====|E  )" "$CUDA_AGENT_FAILURE_LOG" | cut -c1-300 | head -60
    ;;
  timing)
    # The judge's runtimes beside Nsight Compute's, alone and with every other core busy.
    timeout ${TIMING_TIMEOUT:-300} python3 benchmarks/timing_check.py --out "$out" ${TIMING_ARGS:---load-all} \
      > "$out/timing_check.log" 2>&1
    echo "timing_check rc=$?"; grep -v "^ *$" "$out/timing_check.log" | cut -c1-400 | tail -30
    ;;
  fidelity)
    # Published KernelBench solutions (the leaderboard corpus carried in .corpus/, never committed),
    # judged in parts: each call stops submitting after FID_BUDGET minutes; a rerun on the same
    # machine continues from .fidelity (keep the cache: CUDA_AGENT_CACHE stays in the tree). On a
    # fresh machine, put the verdicts.jsonl a call brought back into .fidelity/ and carry that
    # folder: only what it lacks is judged (the builds are redone). On an H200 a published
    # load_inline solution takes ~95 s to build with 14 builds at once, so 300 take about 35 minutes of device time (two or three calls).
    # With FID_ARGS="-c light_cuda_headers=true -c build_zygote=true" builds took 38 s (median) and the
    # one judge worker became the bottleneck (~5 s a record: worker start, baseline, calls): 283 records
    # in 25.5 minutes over three calls. Carrying .fidelity replaces the folder on the machine: copy the
    # verdicts.jsonl the last call brought back into it first, or a warm machine loses what it judged.
    # benchmarks/fidelity_reviewed.json: the refusals classified by reading the solution's source.
    timeout ${FID_TIMEOUT:-560} cuda-agent fidelity --corpus .corpus --out "${FID_OUT:-.fidelity}" \
      --time-budget ${FID_BUDGET:-7} --explain benchmarks/fidelity_reviewed.json ${FID_ARGS:-} \
      > "$out/fidelity.log" 2>&1
    echo "fidelity rc=$?"
    cp "${FID_OUT:-.fidelity}"/fidelity.md "${FID_OUT:-.fidelity}"/fidelity.json "${FID_OUT:-.fidelity}"/verdicts.jsonl "$out/" 2>/dev/null
    grep -v "━" "$out/fidelity.log" | cut -c1-300 | tail -60
    ;;
  release)
    # Who opens the gate, and how the judge writes the inputs at its release: the judge's runtimes of
    # the small sizes with the process's release, the judge's (inputs written by kernels of its
    # context) and the judge's with release_writes=host (an H2D copy), alone and loaded.
    timeout ${RELEASE_TIMEOUT:-200} python3 benchmarks/timing_check.py --out "$out/release-device" --sizes small \
      --gate-release both --no-ncu > "$out/timing_release_device.log" 2>&1
    echo "device writes rc=$?"; grep -E "^\|" "$out/timing_release_device.log"
    timeout ${RELEASE_TIMEOUT:-200} python3 benchmarks/timing_check.py --out "$out/release-host" --sizes small \
      --gate-release judge --no-ncu -c release_writes=host > "$out/timing_release_host.log" 2>&1
    echo "host writes rc=$?"; grep -E "^\|" "$out/timing_release_host.log"
    ;;
  flush)
    # The second flush once a call's inputs are written (JudgeConfig.flush_after_inputs: off, on, and
    # auto, the default: inputs over the L2's size), each against Nsight Compute, on the small sizes
    # (alone and loaded): inputs under the L2's size read from it without the second flush, larger
    # ones write their dirty lines back.
    for v in off on auto; do
      timeout ${FLUSH_TIMEOUT:-240} python3 benchmarks/timing_check.py --out "$out/flush-$v" --sizes small \
        -c flush_after_inputs=$v > "$out/timing_flush_$v.log" 2>&1
      echo "flush_after_inputs=$v rc=$?"; grep -E "^\|" "$out/timing_flush_$v.log"
      grep -oE "^[a-z/-]+ +[A-Za-z0-9-]+ .*markers=\{[^}]*\}" "$out/timing_flush_$v.log" | sed 's/ correct=True//' | cut -c1-200
    done
    ;;
  timingdiag)
    # The two sizes timed over Nsight Compute in earlier runs (ew-256M 23% over its 0.541 ms, mm-8192
    # 2.8% over), without ncu this time: the calls' marker times (stretched past the end marker?),
    # the GPU's clocks and power, with spare workers starting beside the calls and without.
    for spares in 2 0; do
      timeout ${DIAG_TIMEOUT:-250} python3 benchmarks/timing_check.py --out "$out/diag-spares$spares" \
        --cases ew-256M mm-8192 --no-ncu -c spares=$spares > "$out/timing_diag_spares$spares.log" 2>&1
      echo "spares=$spares rc=$?"; grep -E "^[a-z/-]+ +[A-Za-z0-9-]+ .* ms \(" "$out/timing_diag_spares$spares.log" | cut -c1-420
    done
    ;;
  keepplane)
    # The judge's GPU region kept from one process to the next (JudgeConfig.keep_gpu_plane), so that
    # no free on the GPU precedes a process's calls, beside the default that frees it after each
    # process; without ncu (the 1 GB elementwise kernel: 0.654 ms in the judge, 0.54 ms in a plain
    # process and under Nsight Compute). Then the same with ncu, kept, unless KEEP_NCU=0.
    for v in false true; do
      timeout ${KEEP_TIMEOUT:-150} python3 benchmarks/timing_check.py --out "$out/keep-$v" --cases ${KEEP_CASES:-ew-256M ew-32M} \
        --no-ncu -c keep_gpu_plane=$v > "$out/timing_keep_$v.log" 2>&1
      echo "keep_gpu_plane=$v rc=$?"; grep -E "^[a-z/-]+ +[A-Za-z0-9-]+ .* ms \(" "$out/timing_keep_$v.log" | cut -c1-420
    done
    if [ "${KEEP_NCU:-1}" = 1 ]; then
      timeout ${KEEP_TIMEOUT:-150} python3 benchmarks/timing_check.py --out "$out/keep-ncu" --cases ${KEEP_CASES:-ew-256M ew-32M} \
        -c keep_gpu_plane=true > "$out/timing_keep_ncu.log" 2>&1
      echo "keep_gpu_plane=true with ncu rc=$?"; grep -E "^\|" "$out/timing_keep_ncu.log"
    fi
    ;;
  memdiag)
    # Where a memory-bound kernel's time goes under the judge (ew-256M, 1 GB in and out: Nsight
    # Compute 0.51-0.54 ms; the judge 0.657 ms on the H200, and its calls' start-to-end markers say
    # the same, so the kernel itself runs slower in the candidate process): the judge with the
    # default settings and with MEMDIAG_VARIANTS, one JudgeConfig change each (default:
    # touch_pages=true; measured without effect on the H200: flush_l2=false, flush_after_inputs=true,
    # spares=0). Each line gives the calls' marker time beside the runtime, and the GPU's clocks
    # while they ran. (The plain-process probes of this question are retired; their findings:
    # docs/results/2026-12-06-retired-diagnostics.md.)
    # (file names without '=': the device tool brings back only plain names)
    for v in default ${MEMDIAG_VARIANTS-touch_pages=true}; do
      set -- ; [ "$v" = default ] || set -- -c "$v"
      name=${v//=/-}
      timeout ${MEMDIAG_TIMEOUT:-120} python3 benchmarks/timing_check.py --out "$out/memdiag-$name" \
        --cases ${MEMDIAG_CASES:-ew-256M} --no-ncu "$@" > "$out/memdiag_$name.log" 2>&1
      echo "== $v rc=$?"; grep -E "^[a-z/-]+ +[A-Za-z0-9-]+ .* ms \(" "$out/memdiag_$name.log" | cut -c1-420
    done
    ;;
  plane)
    timeout ${PLANE_TIMEOUT:-200} python3 benchmarks/gpu/gpu_plane_check.py 2>&1 | tee "$out/gpu_plane.log" | cut -c1-1200
    ;;
  steps)
    # The judge-step figures: the workspace form (where the targets apply) first, then the single file.
    timeout ${WS_TIMEOUT:-230} python3 benchmarks/judge_step.py --form workspace --mode all --runs ${RUNS:-5} \
      --out "$out/judge_step_workspace.json" > "$out/judge_step_workspace.log" 2>&1
    grep -E "run|│" "$out/judge_step_workspace.log" | cut -c1-700
    FILE_TIMEOUT=${FILE_TIMEOUT:-300} SKIP_INSTALL=1 bash "$0" filestep "$out"
    ;;
  start)
    # Back-to-back warm steps (spares at work).
    timeout ${WARM_TIMEOUT:-150} python3 benchmarks/judge_step.py --form workspace --mode warm --runs ${RUNS:-5} \
      --out "$out/judge_step_warm.json" > "$out/judge_step_warm.log" 2>&1
    grep -E "run|│" "$out/judge_step_warm.log" | cut -c1-500
    ;;
  filestep)
    # The single-file form alone (its cold builds take ~45 s each): 5 cold and 5 warm runs.
    timeout ${FILE_TIMEOUT:-540} python3 benchmarks/judge_step.py --form file --runs ${FILE_RUNS:-5} -c compile_mode=none \
      --out "$out/judge_step_file.json" > "$out/judge_step_file.log" 2>&1
    grep -E "run|│" "$out/judge_step_file.log" | cut -c1-700
    ;;
  probe)
    # Where the time of a judge step goes: both forms, cold and warm, per phase and per compiled file.
    timeout 520 python3 benchmarks/judge_step.py --runs ${RUNS:-3} --out "$out/judge_step.json" > "$out/judge_step.log" 2>&1
    cut -c1-400 "$out/judge_step.log"
    ;;
  bench)
    # The bundled suite with its bundled solutions through the pool, killed (SIGKILL to the whole
    # process group) part-way and resumed with the same --run: the second pass judges only what
    # the first did not finish; the table and the HTML report cover the whole run.
    db="$out/results.sqlite"
    setsid cuda-agent bench --device ${BENCH_DEVICE:-cuda} --run h200-suite --db "$db" --out "$out/bench.jsonl" \
      > "$out/bench_killed.log" 2>&1 &
    pid=$!
    sleep ${KILL_AFTER:-120}
    kill -9 -- -$pid 2>/dev/null; wait $pid 2>/dev/null
    echo "killed after ${KILL_AFTER:-120} s; verdicts in the database:" \
      $(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from verdicts').fetchone()[0])" "$db" 2>&1)
    timeout ${BENCH_TIMEOUT:-330} cuda-agent bench --device ${BENCH_DEVICE:-cuda} --run h200-suite --db "$db" --out "$out/bench.jsonl" \
      --report "$out/bench.html" > "$out/bench.log" 2>&1
    echo "resumed run rc=$?"
    cut -c1-300 "$out/bench.log" | grep -v "━" | tail -70
    ;;
  hwtruth)
    # Speed-of-light and the profile tool (hardware truth): the bundled suite judged once (its table
    # and HTML report carry each runtime's share of speed-of-light, per task and per level, and the
    # roofline), then the agent's profile tool on every workspace solution, the judge's runtime beside
    # Nsight Compute's kernel time of the same candidate. The profile reuses the bench's builds and
    # baselines (same cache folder).
    timeout ${BENCH_TIMEOUT:-330} cuda-agent bench --device cuda --run h200-hwtruth --db "$out/results.sqlite" \
      --out "$out/bench.jsonl" --report "$out/bench.html" > "$out/bench.log" 2>&1
    echo "bench rc=$?"; cut -c1-300 "$out/bench.log" | grep -v "━" | tail -45
    timeout ${PROFILE_TIMEOUT:-240} python3 benchmarks/profile_suite.py --out "$out" --cache "$CUDA_AGENT_CACHE" \
      > "$out/profile_suite.log" 2>&1
    echo "profile_suite rc=$?"; grep -E "^\[|^  runtime|^\|" "$out/profile_suite.log" | cut -c1-300
    ;;
  throughput)
    # Candidates per GPU-hour through the pool (tasks chosen so priming, which measures the
    # torch.compile baselines, stays short; N sized for one call at the 1,000/GPU-hour target).
    timeout ${THROUGHPUT_TIMEOUT:-540} python3 benchmarks/throughput.py --n "${N:-150}" \
      --tasks ${THROUGHPUT_TASKS:-2_GELU 3_Softmax_Rows 6_Batched_Transpose 9_Cumsum_Rows} \
      --out "$out/throughput.json" ${THROUGHPUT_ARGS:-} > "$out/throughput.log" 2>&1
    grep -v "━" "$out/throughput.log" | cut -c1-300 | tail -50
    ;;
  newsource)
    # Published solutions judged from a cold cache (new_source_throughput.py; the leaderboard corpus
    # carried in .corpus/): NST_N sampled, NST_J judges on the GPU, cut at NST_T seconds (the report
    # then comes from --report-only: wall time up to the last verdict); its verdicts read as a
    # fidelity sample. NST_ARGS: more options (e.g. -c light_cuda_headers=false).
    rm -rf "$out/nst"
    timeout ${NST_T:-500} python3 benchmarks/new_source_throughput.py --corpus .corpus --out "$out/nst" \
      --sample ${NST_N:-80} --judges-per-gpu ${NST_J:-3} ${NST_ARGS:-} > "$out/nst.log" 2>&1
    echo "new_source_throughput rc=$?"; grep -v "━" "$out/nst.log" | tail -6 | cut -c1-600
    [ -f "$out/nst/throughput.json" ] && grep -q '"wall_s": [0-9]' "$out/nst/throughput.json" \
      || python3 benchmarks/new_source_throughput.py --out "$out/nst" --report-only
    timeout 120 cuda-agent fidelity --corpus .corpus --out "$out/nst" --report-only \
      --explain benchmarks/fidelity_reviewed.json > "$out/nst_fidelity.log" 2>&1
    echo "fidelity report rc=$?"; grep -v "━" "$out/nst_fidelity.log" | cut -c1-300 | tail -30
    rm -rf "$out/nst/cache" "$out/nst/work"   # the cold cache: large, and not a result
    ;;
  synth)
    # Tasks generated and filtered per hour, the judge's reference checks (Judge.check_reference)
    # inside the pipeline (SYNTH_JUDGE_CHECK=1, the default; 0: without), then the same checks of
    # SYNTH_JUDGE exported tasks afterwards (default 0); the judges check beside the filters
    # (--judge-overlap) unless SYNTH_OVERLAP=0. Its statistics come back in synth_throughput.json,
    # the sample itself packed in synth-sample.tgz. SYNTH_RESUME=1 continues the sample carried in
    # .synth-h200/synth-sample.tgz (from an earlier call) instead of starting anew.
    rm -rf /tmp/synth-h200
    if [ -n "${SYNTH_RESUME:-}" ] && [ -f .synth-h200/synth-sample.tgz ]; then
      tar xzf .synth-h200/synth-sample.tgz -C /tmp && echo "resuming: $(grep -c . /tmp/synth-h200/candidates.jsonl) candidates"
    fi
    gen=${SYNTH_GEN_S:-330}; limit=${SYNTH_TIMEOUT:-540}
    if [ -n "${DEADLINE:-}" ]; then
      left=$((DEADLINE - $(date +%s)))
      limit=$(( left - 15 < limit ? left - 15 : limit ))
      [ "${SYNTH_JUDGE:-0}" = 0 ] && [ "${SYNTH_JUDGE_CHECK:-1}" = 0 ] && [ $((limit - 45)) -lt $gen ] && gen=$((limit - 45))
      echo "synth: ${left} s to the deadline; generation ${gen} s, stage limit ${limit} s"
    fi
    # GPU and CPU busy-ness every 2 s beside the run: which of the two limits the rate.
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 2 \
      > "$out/synth_gpu_util.csv" 2>/dev/null & smi=$!
    vmstat -n 2 > "$out/synth_vmstat.log" 2>/dev/null & vms=$!
    timeout $limit python3 benchmarks/synth_throughput.py --n "${SYNTH_N:-300}" --out /tmp/synth-h200 \
      ${SYNTH_WORKERS:+--workers $SYNTH_WORKERS} ${SYNTH_SHORTCUT_CPU_MS:+--shortcut-cpu-ms $SYNTH_SHORTCUT_CPU_MS} \
      ${SYNTH_MEMORY_MULTIPLE:+--check-memory-multiple $SYNTH_MEMORY_MULTIPLE} ${SYNTH_TARGET_MS:+--target-ms $SYNTH_TARGET_MS} \
      --time-limit $gen --judge-sample "${SYNTH_JUDGE:-0}" --judge-parallel ${JUDGE_PARALLEL:-4} \
      $([ "${SYNTH_JUDGE_CHECK:-1}" = 0 ] || echo --judge-check) $([ "${SYNTH_OVERLAP:-1}" = 0 ] && echo --no-judge-overlap) \
      > "$out/synth.log" 2>&1
    echo "synth rc=$?"
    kill $smi $vms 2>/dev/null
    awk -F', ' '{n++; u+=$2; if ($2 >= 90) hi++} END {if (n) printf "GPU busy: mean %.0f%%, >=90%% in %d of %d samples\n", u/n, hi, n}' \
      "$out/synth_gpu_util.csv"
    awk 'NR > 2 {n++; id+=$15} END {if (n) printf "CPU idle: mean %.0f%%\n", id/n}' "$out/synth_vmstat.log"
    tar czf "$out/synth-sample.tgz" -C /tmp synth-h200
    cp /tmp/synth-h200/throughput.json "$out/synth_throughput.json" 2>/dev/null && python3 -c "import json,sys; print(\"check_split\", json.dumps(json.load(open(sys.argv[1]))[\"check_split\"]))" "$out/synth_throughput.json"
    cp /tmp/synth-h200/report.json "$out/synth_report.json" 2>/dev/null
    cp /tmp/synth-h200/judge_progress.jsonl /tmp/synth-h200/phases.jsonl "$out/" 2>/dev/null
    [ -f "$out/phases.jsonl" ] && cat "$out/phases.jsonl"
    [ -f "$out/judge_progress.jsonl" ] && echo "judged: $(wc -l < "$out/judge_progress.jsonl"), passed:" \
      "$(grep -cE '"ok": ?true' "$out/judge_progress.jsonl")"
    grep -v "━" "$out/synth.log" | cut -c1-300 | tail -80
    ;;
  *)
    echo "unknown stage $stage" >&2; exit 2 ;;
esac
