#!/usr/bin/env bash
# The training stages on a CUDA machine with the tiny model (no download) and the real judge:
#   bash benchmarks/gpu/train_gpu.sh STAGE [OUT_DIR]      STAGE: toy | calls | stages | bench | A+B
# toy: the learning check (CPU judge backend, the policy on the GPU), then RFT on the toy's episodes;
# stages: warm-up, critic and agentic PPO on the CUDA suite with the CUDA judge, for episodes per
# hour and the time split; calls: the second learning check (tool calls sampled token by token);
# bench: the one-GPU targets (rollouts of 32 ten-turn episodes of the 1.5B shape, the decode step,
# training at 8k, 32k and 128k, 7B with LoRA at 32k), each with its own time limit (ROLLOUT_ARGS, e.g.
# --no-cuda-graphs, go to the rollout benchmark). Installs wheels from ./.whl (pydantic etc.) and this package in place,
# as device_gpu.sh does.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
stage=${1:-toy}
out=${2:-${OUT:-runs/train}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUDA_AGENT_CACHE=${CUDA_AGENT_CACHE:-$PWD/.cache/cuda_agent}
if [ -z "${SKIP_INSTALL:-}" ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl 2>&1 | grep -v WARN
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN
  python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name(0))'
fi
case "$stage" in
  *+*)
    for s in ${stage//+/ }; do SKIP_INSTALL=1 bash "$0" "$s" "$out"; done ;;
  toy)
    cuda-agent train toy "$out/toy" --steps "${TOY_STEPS:-12}"
    cuda-agent train ppo --config "$out/toy/toy.json" --out "$out/toy/run" --train-device cuda
    # RFT on the toy's own episodes (the tiny model's CUDA-suite episodes of `stages` earn no
    # positive reward, so nothing of theirs passes the filter): filter, parquet, SFT on the GPU.
    cuda-agent train rft --out "$out/toy/rft" --model "$out/toy/model" --episodes "$out/toy/run/episodes" \
      --train-device cuda
    cuda-agent train metrics "$out/toy/run" "$out/toy/rft" ;;
  calls)
    cuda-agent train toy "$out/calls" --kind calls ${CALLS_STEPS:+--steps "$CALLS_STEPS"}  # default: the toy's (20)
    # CALLS_ARGS: settings for the check's PPO run, e.g. "-c episodes_per_step=16 -c optim.actor_lr=1e-3"
    cuda-agent train ppo --config "$out/calls/toy.json" --out "$out/calls/run" --train-device cuda ${CALLS_ARGS:-}
    cuda-agent train metrics "$out/calls/run" ;;
  bench)
    # a figure per line as each finishes (a timeout still leaves those before it)
    timeout ${ROLLOUT_TIMEOUT:-300} python3 benchmarks/rollout_bench.py --shape qwen2.5-1.5b --device cuda \
      --episodes 32 --turns 10 --reply 512 ${ROLLOUT_ARGS:-} | tee "$out/rollout.txt"
    timeout ${DECODE_TIMEOUT:-120} python3 benchmarks/decode_step.py --shape qwen2.5-1.5b --rows 32 --context 4096 \
      | tee "$out/decode_step.txt"
    timeout ${TRAIN_TIMEOUT:-240} python3 benchmarks/train_step_bench.py --shape qwen2.5-1.5b --device cuda \
      --context 8192 32768 131072 | tee "$out/train_1.5b.txt"
    timeout ${LORA_TIMEOUT:-180} python3 benchmarks/train_step_bench.py --shape qwen2.5-7b --lora --device cuda \
      --context 32768 | tee "$out/train_7b_lora.txt" ;;
  stages)
    common=(--model tiny --tasks suite --device cuda --train-device cuda -c episodes_per_step=8 -c concurrency=8)
    cuda-agent train warmup --out "$out/warmup" "${common[@]}" --steps 2 -c episode.turn_tokens=512
    cuda-agent train critic --out "$out/critic" --model "$out/warmup/final/actor" --episodes "$out/warmup/episodes" \
      --train-device cuda -c epochs=2
    cuda-agent train ppo --out "$out/ppo" "${common[@]}" --steps 2 --critic "$out/critic/final/critic" \
      -c episode.max_turns=6 -c episode.turn_tokens=256
    cuda-agent train metrics "$out/warmup" "$out/critic" "$out/ppo" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
