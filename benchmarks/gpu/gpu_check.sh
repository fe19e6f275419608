#!/usr/bin/env bash
# Everything the first GPU clef is lent measures, in one command (about 7 minutes on one H200).
#
#   OUT=/some/folder bash benchmarks/gpu/gpu_check.sh          # on the GPU machine
#   OUT=/tmp/smoke bash benchmarks/gpu/gpu_check.sh --cpu-smoke  # the same steps, tiny, on a CPU
#
# Steps: (1) nvidia-smi, nproc, the interpreter and every module's version (the wheels of
# benchmarks/gpu/gpu_wheels.txt, found in benchmarks/gpu/wheels/, unpacked first on PYTHONPATH);
# (2) golden parity on the device, both families, float32 and bfloat16; (3) bench_gpu.py, Omni
# text stack at real dimensions, grouped_mm vs eager, 4 layers, budgets 16k/64k/128k, then
# --family dense; (4) bench_score.py on the device (text and mixed parts); (5) a short
# bench_feed.py --sets text,image on this machine's CPUs; (6) on the device only, bench_engines.py:
# the HF and vLLM engines side by side, when a vLLM is at hand ($CLEF_VLLM_PYTHON, this Python, or
# the CUDA vllm wheels in $CLEF_VLLM_WHEELS: they do not fit the 64 MiB the device tool carries, so
# a wheel folder must be there; otherwise the step says it was skipped, and why), with vLLM's bare
# LLM.encode and its own pooler beside them, then bench_feed.py --engine vllm (clef's vLLM feed
# around a simulated device), then vllm_chunked.py: clef's vLLM engine compiled (CUDA graphs)
# against eager on prompts longer than one prefill chunk, and prefix caching off in the engines
# clef builds (vllm#48901, vllm#44485). Their figures go to the log. Under $OUT, 8 files:
# gpu_check.log, environment.json, parity.json, gpu_omni.json, gpu_dense.json, score.json,
# feed.json and summary.json (and feed_vllm.json, vllm_chunked.json when a vLLM was at hand). A
# step that fails or runs out of its time is logged and the others still run; a failed check
# (vllm-chunked) is named again at the end, and the script then exits 1.
set -uo pipefail

SMOKE=0
if [[ "${1:-}" == "--cpu-smoke" ]]; then SMOKE=1; elif [[ -n "${1:-}" ]]; then
  echo "usage: OUT=DIR bash benchmarks/gpu/gpu_check.sh [--cpu-smoke]" >&2; exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$ROOT/gpu-check-out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: > "$LOG"
PY="${PYTHON:-python3}"
exec > >(tee -a "$LOG") 2>&1

SLOWER="${SLOWER:-1}"  # limits are sized for the H200 machine; --cpu-smoke on a loaded laptop gets 6x
[[ $SMOKE -eq 1 ]] && SLOWER="${SLOWER_SMOKE:-6}"
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log its status, never stop the run
  local name=$1 limit=$(($2 * SLOWER)); shift 2
  local started=$SECONDS
  echo; echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
  timeout --kill-after=10 "$limit" "$@"
  local status=$?
  echo "=== $name: exit $status after $((SECONDS - started))s"
  return "$status"
}
FAILED=()  # the checks that failed (a step that measures only is logged, never counted here)

echo "=== clef gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) smoke=$SMOKE"
(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null) || true
nvidia-smi || echo "nvidia-smi: not available"
echo "nproc: $(nproc)"
"$PY" --version

VENDOR="${TMPDIR:-/tmp}/clef-gpu-vendor"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [[ $SMOKE -eq 0 ]]; then
  if compgen -G "$ROOT/benchmarks/gpu/wheels/*.whl" > /dev/null; then
    rm -rf "$VENDOR"
    "$PY" "$ROOT/benchmarks/gpu/gpu_env.py" install "$ROOT/benchmarks/gpu/wheels" "$VENDOR"
    export PYTHONPATH="$VENDOR:$PYTHONPATH"
  else
    echo "WARNING: no wheels in benchmarks/gpu/wheels (see benchmarks/gpu/gpu_wheels.txt); using this machine's packages"
  fi
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false
step environment 45 "$PY" "$ROOT/benchmarks/gpu/gpu_env.py" report "$OUT/environment.json"

if [[ $SMOKE -eq 1 ]]; then
  DEVICE=cpu
  PARITY=(--dtypes float32,bfloat16 --limit 1)
  GPU=(--cpu-smoke)
  DENSE=()
  SCORE=(--records 6 --media-records 2 --workers 0)
  FEED=(--sets text --workers 0 --scale 0.02 --windows 1)
else
  DEVICE=cuda
  PARITY=(--dtypes float32,bfloat16)
  GPU=(--layers 4 --budgets 16384,65536,131072 --lengths 1024,4096,8192,16384 --min-seconds 1.0)
  DENSE=(--budgets 16384,65536 --lengths 1024,8192)  # without its kernels the delta rule is slow
  SCORE=(--records 1000 --media-records 80)
  FEED=(--sets text,image --workers "1,$(($(nproc) - 1))" --scale 1 --windows 4)
fi

cd "$ROOT" || exit 1
step parity 90 "$PY" benchmarks/gpu/gpu_parity.py --device "$DEVICE" "${PARITY[@]}" --json "$OUT/parity.json"
step gpu-omni 110 "$PY" benchmarks/gpu/bench_gpu.py "${GPU[@]}" --quiet --json "$OUT/gpu_omni.json"
step gpu-dense 60 "$PY" benchmarks/gpu/bench_gpu.py "${GPU[@]}" ${DENSE[@]+"${DENSE[@]}"} --family dense --quiet --json "$OUT/gpu_dense.json"
step score 80 "$PY" benchmarks/score/bench_score.py --device "$DEVICE" --skip c "${SCORE[@]}" --json "$OUT/score.json"
step feed 90 "$PY" benchmarks/feed/bench_feed.py "${FEED[@]}" --media-dir "${TMPDIR:-/tmp}/clef-feed-media" \
  --json "$OUT/feed.json"
if [[ $SMOKE -eq 0 ]]; then  # the engines side by side (issue 33): HF against vLLM on the device
  VLLM_PY="${CLEF_VLLM_PYTHON:-}"
  if [[ -z "$VLLM_PY" && -n "${CLEF_VLLM_WHEELS:-}" ]]; then  # the CUDA vllm wheels do not fit the carry
    "$PY" -m venv "$VENDOR-vllm" && "$VENDOR-vllm/bin/pip" install --quiet --no-index \
      --find-links "$CLEF_VLLM_WHEELS" vllm && VLLM_PY="$VENDOR-vllm/bin/python"
  fi
  [[ -z "$VLLM_PY" ]] && "$PY" -c "import vllm" 2> /dev/null && VLLM_PY="$PY"
  if [[ -n "$VLLM_PY" ]]; then
    step engines 60 env CLEF_VLLM_PYTHON="$VLLM_PY" "$PY" benchmarks/engines/bench_engines.py --device cuda \
      --dtype bfloat16 --records 400
    # clef's side of the vLLM engine around a simulated device at the real width (issue 37)
    step feed-vllm 60 "$PY" benchmarks/feed/bench_feed.py --engine vllm --sets text,image --workers 1 \
      --hidden-states drop --media-dir "${TMPDIR:-/tmp}/clef-feed-media" --json "$OUT/feed_vllm.json"
    # compiled pooling against eager past the first prefill chunk, and no prefix caching (two vLLM starts)
    step vllm-chunked 240 "$PY" benchmarks/gpu/vllm_chunked.py --vllm-python "$VLLM_PY" --chunk 512 --dtype bfloat16 \
      --json "$OUT/vllm_chunked.json" || FAILED+=(vllm-chunked)
  else
    echo "=== engines: skipped: no vLLM here (set CLEF_VLLM_PYTHON, or CLEF_VLLM_WHEELS=DIR with the CUDA vllm wheels)"
  fi
fi
step summary 15 "$PY" benchmarks/gpu/gpu_summary.py "$OUT"
echo "=== done $(date -u +%H:%M:%S); files under $OUT:"
ls -la "$OUT"
if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo "=== FAILED checks: ${FAILED[*]} (their FAILED: lines are above)"
  exit 1
fi
