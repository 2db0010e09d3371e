#!/usr/bin/env bash
# GPU check of optuna-saturn on the device machine. From the repo root:  bash benchmarks/gpu/check.sh   (carry: [".gpu"]: the wheels, benchmarks/gpu/wheels.sh)
# Made to run twice in one lent GPU's 15 minutes: the whole script, set-up included, within GPU_CHECK_BUDGET (420 s
# by default; one command may run 600 s). Each part runs under its own limit (the least of its cap and what is left
# of the budget, less RESERVE for the summary); the caps of the default parts add up within the budget (checked
# below, and by tests/test_gpu_check_script.py), and the SUMMARY is always printed.
# Everything goes to $OUT/gpu-check.log (+ gpu-check-*.json, gpu-check-runs.tar.gz). A failed part is reported
# ("PART x: FAILED") and the next one still runs.
# Env knobs: PY (base interpreter, default python3), WHEELS (default .gpu/wheels), GPU_CHECK_BUDGET (seconds, 420),
# GPU_CHECK_PARTS (default review: benchmarks/gpu/review_checks.py, C0-C10 on one GPU, and C8 and M1-M4 on two;
# also sweep, env, parity, example, which need a budget of their own), GPU_CHECK_TRIALS (8),
# GPU_CHECK_ARMS (plain,cold,warm), GPU_CHECK_EXAMPLE_TRIALS (4), V (venv path, default /tmp/v),
# GPU_CHECK_REVIEW_ARGS (more arguments for review_checks.py: "--dry" rehearses the whole script on a CPU machine).
set -u
set -o pipefail
OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 TOKENIZERS_PARALLELISM=false
export GPU_CHECK_WORK=${GPU_CHECK_WORK:-/tmp/gpu-check}
export SATURN_EXAMPLE_DATA=$GPU_CHECK_WORK/example-data
rm -rf "$GPU_CHECK_WORK"; mkdir -p "$GPU_CHECK_WORK"

# Caps in seconds: the header (nvidia-smi, torch's version), set-up (a venv, --no-deps installs, DeepSpeed's
# cpu_adam built), the review (review_checks.py's parts on one GPU: ONE_GPU_SECONDS there, 285 s, within
# REVIEW_CAP - 5), what the summary and the tarball take. 20 + 100 + 290 + 10 = 420. The parts' caps are estimates:
# the check has not run on a GPU yet.
HEADER=20 SETUP_CAP=100 REVIEW_CAP=290 RESERVE=10

main() {
  local PY=${PY:-python3} V=${V:-/tmp/v} WHEELS=${WHEELS:-.gpu/wheels} BUDGET=${GPU_CHECK_BUDGET:-420}
  local T0=$SECONDS status=() rc
  export PY V WHEELS
  local PARTS=",${GPU_CHECK_PARTS:-review},"
  # (the caps of the parts asked for, set-up's and the header's included, must add up within the budget)
  local caps=$(( HEADER + SETUP_CAP + RESERVE ))
  [[ $PARTS == *,review,* ]] && caps=$(( caps + REVIEW_CAP ))
  [[ $PARTS == *,env,* ]] && caps=$(( caps + 90 ))
  [[ $PARTS == *,sweep,* ]] && caps=$(( caps + 240 ))
  [[ $PARTS == *,parity,* ]] && caps=$(( caps + 150 ))
  [[ $PARTS == *,example,* ]] && caps=$(( caps + 150 ))
  echo "budget ${BUDGET}s; the caps of the parts asked for add up to ${caps}s"
  (( caps > BUDGET )) && echo "WARNING: caps ${caps}s > budget ${BUDGET}s: the last parts get what is left, or SKIP"
  left() { echo $(( BUDGET - RESERVE - (SECONDS - T0) )); }
  cap() { local l; l=$(left); (( l < $1 )) && echo $(( l > 10 ? l : 10 )) || echo "$1"; }  # min(cap, time left)
  part() {  # part NAME CAP_SECONDS CMD...: run CMD under a time limit, record OK/FAILED
    local name=$1 limit; limit=$(cap "$2"); shift 2
    echo; echo "===== PART $name (limit ${limit}s, $(left)s of the budget left) ====="
    local t=$SECONDS
    timeout -k 5 "$limit" "$@"; rc=$?
    (( rc == 124 || rc == 137 )) && echo "PART $name: FAILED (timed out after ${limit}s)"
    status+=("$name=$([ $rc = 0 ] && echo OK || echo "FAILED(rc=$rc)") $((SECONDS - t))s")
  }

  echo "===== gpu-check $(date -u +%FT%TZ) on $(hostname) ====="
  timeout 20 nvidia-smi -L 2>&1 || echo "(nvidia-smi failed)"
  timeout 20 nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 | head -5
  echo "nproc $(nproc); base python: $(command -v "$PY") $("$PY" -V 2>&1)"
  timeout 30 "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "count", torch.cuda.device_count())' 2>&1
  du -sh "$WHEELS" 2>/dev/null; ls "$WHEELS" 2>&1

  part setup "$SETUP_CAP" bash benchmarks/gpu/setup.sh
  if [ "$rc" != 0 ]; then
    echo "SETUP FAILED: nothing else can run."; printf '  %s\n' "${status[@]}"; return 1
  fi
  local P="$V/bin/python"

  # the GPU check's parts C0-C10 (issues 36 and 46; C8 and M1-M4 on two GPUs): every CHECK line PASS, INFO or SKIP
  # shellcheck disable=SC2086
  [[ $PARTS == *,review,* ]] && part review "$REVIEW_CAP" "$P" benchmarks/gpu/review_checks.py \
    ${GPU_CHECK_REVIEW_ARGS:-} --budget "$(( $(cap "$REVIEW_CAP") - 5 ))"
  [[ $PARTS == *,env,* ]] && part env 90 "$P" benchmarks/gpu/gpu_check.py env
  # plain Optuna (n_jobs=1, on cuda) vs SaturnExecutor(devices="auto") cold and warm, the same enqueued trials
  [[ $PARTS == *,sweep,* ]] && part sweep 240 "$P" benchmarks/gpu/gpu_check.py sweep --budget "$(( $(cap 240) - 25 ))"
  [[ $PARTS == *,parity,* ]] && part parity 150 "$P" benchmarks/gpu/gpu_check.py parity --budget "$(( $(cap 150) - 20 ))"
  if [[ $PARTS == *,example,* ]] && (( $(left) <= 70 )); then
    status+=("example=SKIPPED($(left)s left)")
  elif [[ $PARTS == *,example,* ]]; then
    # the example as a user runs it: TPE + median pruner, devices=auto, single,ddp, SQLite storage
    # (run from a scratch folder: its saturn-runs/ and profiles/ land there, and in gpu-check-runs.tar.gz)
    mkdir -p "$GPU_CHECK_WORK/example"
    part example 150 bash -c 'cd "$1" && exec "$2" "$3/examples/gpt2_sweep.py" --n-trials "$4" \
      --storage "sqlite:///$1/example.sqlite3" --study-name gpu-check' _ "$GPU_CHECK_WORK/example" "$P" "$PWD" \
      "${GPU_CHECK_EXAMPLE_TRIALS:-4}"
  fi

  if [ -e "$GPU_CHECK_WORK/linked-builtin-strategies" ] && [ -L optuna_saturn/_builtin_strategies ]; then
    rm -f optuna_saturn/_builtin_strategies  # setup's fallback link
  fi
  tar -czf "$OUT/gpu-check-runs.tar.gz" -C "$GPU_CHECK_WORK" --exclude=example-data . 2>/dev/null || true
  nvidia-smi --query-gpu=memory.used --format=csv 2>/dev/null | tail -1 | sed 's/^/GPU memory used at the end: /'
  echo; echo "===== SUMMARY ($((SECONDS - T0))s) ====="; printf '  %s\n' "${status[@]}"
  grep -hE "^  RATIO|^PART [a-z]+: (OK|FAILED)|^CHECK [CM][0-9]" "$OUT/gpu-check.log" 2>/dev/null | sed 's/^ */  /' |
    awk '!seen[$0]++'
  ! printf '%s\n' "${status[@]}" | grep -q FAILED
}

main 2>&1 | tee "$OUT/gpu-check.log"
