#!/usr/bin/env bash
# One script for the next GPU session (issues 35 and 42). Run from the project root on a machine with an NVIDIA GPU
# and torch, maybe without a package index, maybe a bare one (python3, no `python`):
#
#   bash benchmarks/gpu_host.sh [--dry-run] [WHEEL_DIR]
#
# 0. says what it needs and what is missing (python3, pip, torch, torchvision, nvidia-smi, autotune's dependencies,
#    pytest): found without importing anything, so nothing it installs is imported before it is installed;
# 1. the machine (nvidia-smi, torch and the GPU; exit 3 where torch sees none), then installs autotune (pip install
#    --no-deps --no-build-isolation -e .), after WHEEL_DIR/*.whl when given (optuna and the rest, fetched on a
#    machine with an index: docs/gpu.md, "The next GPU"), and only then imports it (`autotune env`);
# 2. makes a JPEG folder (ImageFolder layout: 8192 JPEGs of 320x240 in 10 classes, benchmarks/make_jpegs.py; an
#    epoch of 512 would drain the loader every 8 batches, which the reference loop below never does);
# 3. runs autotune run --model resnet18 --device cuda --data DIR --timeout 3m, lets it end by its own budget rule
#    (its --timeout + 5% + what a tuner overshoots), then exports rec.yaml and shows the study (show --explain: the
#    ceilings and the diagnosis);
# 4. re-measures the recommendation beside PyTorch's defaults and the seeds' recipe in fresh processes, rounds
#    interleaved (A B C, C B A), by benchmarks/gpu_reference.py, a training loop that shares no code with autotune,
#    and prints one table;
# 5. runs issue 35's gpu tests (the two ceilings, a fork-served CUDA trial, an eager resnet18 trial's wall time),
#    then the rest of `python -m pytest -m gpu -n 0 tests/machine/test_gpu.py` with the time left.
# Step 5 is that one pytest command, each test once; issue 35's tests go first so that the time limit, when it binds,
# cuts the older tests (which passed on an H200 on 2026-11-26), not the new ones.
#
# It ends within GPU_HOST_BUDGET_S seconds (default 520; 9 minutes less room for the last kill): every step runs
# under `timeout`, with a limit that leaves the later steps their share, and a step cut by its limit says so.
# It keeps every log in $OUT (if set, else ./gpu-host-out/; `keeps` below lists them): gpu_host.log (all it
# printed), one log per step, the study (gpu.db) and beside it the study's folder with each trial's, each ceiling's
# and each finalist's log, rec.yaml, and the reference loop's table, results and each child's log. It never downloads
# anything: pip runs with --no-index when given wheels (and with --no-deps), every model is built with weights=None.
#
# Environment: PYTHON (default python3, else python), OUT, GPU_HOST_BUDGET_S (520), GPU_HOST_RUN_S (the run's
# --timeout in seconds, 180), GPU_HOST_ROUNDS (the comparison's rounds; default 2, 1 when little time is left),
# GPU_HOST_DATA (an existing JPEG folder to use instead of making one), GPU_HOST_JPEGS (how many to make, 8192).
# --dry-run prints what is missing, each step and the time limit it would get if every step before it used all of
# its own (the worst case), and the logs it keeps, and runs nothing. Exit: 0 when it ran to the end (read the summary
# for what passed), 2 for bad arguments, 3 where torch sees no CUDA GPU (or no Python), 130 when interrupted.
# Sourced (`source benchmarks/gpu_host.sh`), it only defines its functions (tests/test_gpu_host_script.py).

# issue 35's gpu tests in tests/machine/test_gpu.py, run first (tests/test_gpu_host_script.py checks they exist)
NEW_TESTS=(
  test_the_data_path_ceiling_with_pinned_memory_on_cuda
  test_the_model_ceiling_on_cuda_outruns_the_full_trial_at_zero_workers
  test_a_second_cuda_trial_is_forked_by_the_fork_server
  test_an_eager_resnet18_trial_through_the_fork_server_wall_time
)
GPU_TESTS=tests/machine/test_gpu.py

usage() { sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

# what autotune imports beyond torch (module: the wheel that brings it), found without importing them
DEPS=(optuna:optuna yaml:PyYAML psutil:psutil pandas:pandas pynvml:nvidia-ml-py tqdm:tqdm PIL:pillow
      numpy:numpy sqlalchemy:SQLAlchemy alembic:alembic)
# the run may end this much after its --timeout: 5% (its own rule) and what a tuner overshoots (a trial is never
# cut short; the H200's run of 2026-11-26 ended 27% late), plus its start (importing torch, the workload's check)
RUN_OVER_PCT=${RUN_OVER_PCT:-32}
RUN_START_S=${RUN_START_S:-30}

parse_args() {  # sets DRY, WHEELS, BUDGET, RUN_S, ROUNDS; exits 2 on a mistake
  DRY=0
  WHEELS=""
  local arg
  for arg in "$@"; do
    case "$arg" in
      -h|--help) usage; exit 0 ;;
      --dry-run) DRY=1 ;;
      -*) echo "gpu_host.sh: unknown option $arg" >&2; usage >&2; exit 2 ;;
      *) if [ -n "$WHEELS" ]; then echo "gpu_host.sh: one WHEEL_DIR at most (got $WHEELS and $arg)" >&2; exit 2; fi
         WHEELS=$arg ;;
    esac
  done
  if [ -n "$WHEELS" ]; then
    [ -d "$WHEELS" ] || { echo "gpu_host.sh: WHEEL_DIR $WHEELS is not a folder" >&2; exit 2; }
    compgen -G "$WHEELS/*.whl" >/dev/null || { echo "gpu_host.sh: WHEEL_DIR $WHEELS holds no .whl file" >&2; exit 2; }
    WHEELS=$(cd "$WHEELS" && pwd)
  fi
  BUDGET=${GPU_HOST_BUDGET_S:-520}; whole_seconds GPU_HOST_BUDGET_S "$BUDGET"
  RUN_S=${GPU_HOST_RUN_S:-180}; whole_seconds GPU_HOST_RUN_S "$RUN_S"
  JPEGS=${GPU_HOST_JPEGS:-8192}; whole_seconds GPU_HOST_JPEGS "$JPEGS"
  ROUNDS=${GPU_HOST_ROUNDS:-}; [ -z "$ROUNDS" ] || whole_seconds GPU_HOST_ROUNDS "$ROUNDS"
  if [ -n "${GPU_HOST_DATA:-}" ] && [ ! -d "$GPU_HOST_DATA" ]; then
    echo "gpu_host.sh: GPU_HOST_DATA $GPU_HOST_DATA is not a folder" >&2; exit 2
  fi
}

whole_seconds() {  # NAME VALUE: a whole number, else exit 2
  case "$2" in ''|*[!0-9]*) echo "gpu_host.sh: $1 must be a whole number, got '$2'" >&2; exit 2 ;; esac
}

# --- time: each step's limit leaves the later steps their share -------------------------------------------------------
CLOCK=0  # --dry-run: the worst case, each step taking its whole limit
now() { if [ "${DRY:-0}" = 1 ]; then echo "$CLOCK"; else echo "$SECONDS"; fi; }
left() { echo $(( BUDGET - $(now) )); }
limit_for() {  # WANT RESERVE: the least of WANT and what is left once RESERVE is kept for the later steps
  local l=$(( $(left) - $2 ))
  (( l > $1 )) && l=$1
  echo "$l"
}

MIN_STEP_S=${MIN_STEP_S:-10}  # a step with less time than this is skipped, not started
STEP_PID=""
on_signal() {
  echo "gpu_host.sh: interrupted; stopping the running step"
  [ -n "$STEP_PID" ] && kill -TERM -- "-$STEP_PID" 2>/dev/null
  exit 130
}

step() {  # NAME LIMIT CMD...: CMD under `timeout` (its own process group), its output to $OUT/NAME.log and here
  local name=$1 limit=$2; shift 2
  if (( limit < MIN_STEP_S )); then
    echo "== $name: skipped, $(left) s left of the ${BUDGET} s budget"
    return 125
  fi
  echo "== $name [time limit ${limit} s, at $(now) s]: $*"
  if [ "${DRY:-0}" = 1 ]; then CLOCK=$(( CLOCK + limit )); return 0; fi
  local t0=$SECONDS rc tail_pid
  : >"$OUT/$name.log"
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1 </dev/null &
  STEP_PID=$!
  tail -s 0.5 --pid="$STEP_PID" -n +1 -f "$OUT/$name.log" &
  tail_pid=$!
  wait "$STEP_PID"; rc=$?
  STEP_PID=""
  wait "$tail_pid" 2>/dev/null
  if (( rc == 124 || rc == 137 )); then
    echo "-- $name: CUT by its ${limit} s time limit after $(( SECONDS - t0 )) s (rc $rc)"
  else
    echo "-- $name: rc $rc in $(( SECONDS - t0 )) s"
  fi
  return "$rc"
}

pytest_line() {  # LOG: pytest's closing line, or how far a run that was cut got
  local log=$1 line
  [ -f "$log" ] || { echo "not run"; return; }
  line=$(grep -E "^=+ .*[0-9]+ (passed|failed|error|errors|skipped|deselected).* in [0-9.]+s|no tests ran" "$log" \
         | tail -n 1)
  if [ -n "$line" ]; then echo "$line"; return; fi
  # -v -s: a test's status word follows its printed lines, on the test's line or one of its own
  echo "cut before its end: $(grep -oE '\bPASSED\b' "$log" | wc -l) passed," \
       "$(grep -oE '\b(FAILED|ERROR)\b' "$log" | wc -l) failed so far"
}

# --- what it needs, what it keeps ----------------------------------------------------------------------------------
find_python() {  # sets PY: $PYTHON, else python3 (a bare Ubuntu has no `python`), else python; empty when none
  PY=${PYTHON:-}
  [ -n "$PY" ] || PY=$(command -v python3 || command -v python || true)
}

needs() {  # says what the steps need and what is missing, found without importing anything; sets NEED_GPU, NEED_PY
  NEED_GPU=1
  NEED_PY=1
  echo "== needs (found without importing anything: what the script installs is imported only after it installs it)"
  command -v timeout >/dev/null || echo "   missing: timeout (coreutils): every step runs under it"
  if ! command -v nvidia-smi >/dev/null; then
    NEED_GPU=0
    echo "   missing: nvidia-smi: no NVIDIA driver here, so no GPU to measure (a real run exits 3)"
  fi
  if [ -z "$PY" ] || ! command -v "$PY" >/dev/null; then
    NEED_PY=0
    echo "   missing: python3 (none on PATH; set PYTHON=/path/to/python)"
    return
  fi
  "$PY" - "${WHEELS:-}" "${DEPS[@]}" pytest:pytest xdist:pytest-xdist <<'PYEOF'
import importlib.util, os, sys

wheels, deps = sys.argv[1], sys.argv[2:]
have = {w.split("-")[0].lower().replace("_", "-") for w in (os.listdir(wheels) if wheels else []) if w.endswith(".whl")}
print(f"   python: {sys.executable} {sys.version.split()[0]}")
for module, why in (("pip", "pip: the install step needs it (apt install python3-pip, or python3 -m ensurepip)"),
                    ("torch", "torch: install a CUDA build of PyTorch first (the script never downloads it)"),
                    ("torchvision", "torchvision: install it beside torch (the workloads and the reference need it)")):
    if importlib.util.find_spec(module) is None:
        print(f"   missing: {why}")
ok = []
for dep in deps:
    module, wheel = dep.split(":")
    if importlib.util.find_spec(module) is not None:
        ok.append(wheel)
    elif wheel.lower() in have:
        ok.append(f"{wheel} (from WHEEL_DIR)")
    elif wheel in ("pytest", "pytest-xdist"):
        print(f"   missing: {wheel}: " + ("the gpu tests are skipped" if wheel == "pytest" else
                                           "the gpu tests run without the default options' -n"))
    else:
        print(f"   missing: {wheel} (import {module}): autotune cannot run without it: add its wheel to WHEEL_DIR "
              "(docs/gpu.md, 'The next GPU')")
print("   found: " + ", ".join(ok))
PYEOF
}

keeps() {  # the logs a run leaves in $OUT
  echo "== keeps in $OUT: gpu_host.log (everything printed); one log per step (<step>.log); gpu.db (the study) and" \
       "beside it the study's folder: trial-<n>.log for each trial, ceiling-model.log and ceiling-data-w<n>.log for" \
       "each ceiling's point, finalist-<r>-*.log, confirm-<r>-*.log, worst-case-*.log and parity.log; rec.yaml;" \
       "reference_table.txt, reference_results.jsonl and <config>-round<r>.log for each reference child" \
       "(benchmarks/gpu_reference.py)"
}

# --- the steps -------------------------------------------------------------------------------------------------------
machine() {  # exits 3 where torch sees no CUDA GPU
  [ "$DRY" = 1 ] && return 0
  timeout 20 nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap --format=csv,noheader \
    || echo "   (nvidia-smi: not available)"
  if ! timeout 120 "$PY" -c "import sys, torch, torchvision
ok = torch.cuda.is_available()
print('   python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision',
      torchvision.__version__, '|', torch.cuda.get_device_name(0) if ok else 'NO CUDA GPU visible to torch')
sys.exit(0 if ok else 3)"; then
    echo "gpu_host.sh: torch sees no CUDA GPU here (or torch/torchvision is missing): nothing to measure"
    exit 3
  fi
}

install_autotune() {  # sets HAVE_AUTOTUNE
  if [ -n "$WHEELS" ]; then
    step wheels "$(limit_for 90 420)" "$PY" -m pip install --no-index --no-deps "$WHEELS"/*.whl
  fi
  step install "$(limit_for 60 360)" "$PY" -m pip install --no-deps --no-build-isolation -e . \
    || echo "   the editable install did not finish: going on with PYTHONPATH=$ROOT (python -m autotune.cli)"
  HAVE_AUTOTUNE=1
  if [ "$DRY" = 0 ] && ! timeout 120 "$PY" -c "import autotune.cli, optuna, yaml, psutil, pandas, pynvml, tqdm, PIL"
  then
    HAVE_AUTOTUNE=0
    echo "   autotune cannot run here (a dependency above is missing: carry its wheel, docs/gpu.md):" \
         "only the comparison of PyTorch's defaults and the seeds' recipe runs"
  fi
  if [ "$HAVE_AUTOTUNE" = 1 ]; then
    step env "$(limit_for 30 340)" "$PY" -m autotune.cli env
  fi
}

pytest_setup() {  # sets PYTEST_OK and PYTEST (the command, without its test ids)
  PYTEST_OK=0
  if [ "$DRY" = 1 ] || timeout 60 "$PY" -c "import pytest" 2>/dev/null; then PYTEST_OK=1; fi
  [ "$HAVE_AUTOTUNE" = 1 ] || PYTEST_OK=0
  if [ "$DRY" = 1 ] || timeout 60 "$PY" -c "import xdist" 2>/dev/null; then
    PYTEST=("$PY" -m pytest -m gpu -n 0)  # -n 0: serially, one GPU (the default options name -n)
  else
    PYTEST=("$PY" -m pytest -o "addopts=" -m gpu)  # no pytest-xdist here: drop the default options that need it
    echo "   (pytest-xdist is not installed: pytest runs without the default options' -n)"
  fi
  PYTEST+=(-v -s -ra -p no:cacheprovider)
  [ "$PYTEST_OK" = 1 ] || echo "== pytest: skipped (pytest or autotune's dependencies missing: docs/gpu.md)"
}

run_limit() {  # RUN_S: the run's step limit, so that it ends by its own budget rule before the step cuts it
  echo $(( RUN_S * (100 + RUN_OVER_PCT) / 100 + RUN_START_S ))
}

tune() {  # a budgeted run; its recommendation in $OUT/rec.yaml, its study and every trial's log in $OUT
  # the run's limit lets it end by its own rule (run_limit); the export, show and one round of the comparison
  # (130 s) are kept for after it
  local room=$(( ($(left) - 130 - RUN_START_S) * 100 / (100 + RUN_OVER_PCT) ))
  (( room < RUN_S )) && RUN_S=$room
  if (( RUN_S < 60 )); then
    echo "== run: skipped, $(left) s left of the ${BUDGET} s budget (a run needs 60 s at least)"
    return
  fi
  step run "$(run_limit)" "$PY" -m autotune.cli run --model resnet18 --device cuda --data "$DATA" \
    --timeout "${RUN_S}s" --storage "sqlite:///$DB" --no-progress
  step export "$(limit_for 30 70)" "$PY" -m autotune.cli export --storage "sqlite:///$DB" -o "$OUT/rec.yaml"
  step show "$(limit_for 20 50)" "$PY" -m autotune.cli show --storage "sqlite:///$DB" --explain
}

compare() {
  local rec=() limit
  if [ "$DRY" = 1 ] || [ -s "$OUT/rec.yaml" ]; then rec=(--rec "$OUT/rec.yaml"); fi
  limit=$(limit_for 150 0)
  if [ -z "$ROUNDS" ]; then
    if (( limit >= 100 )); then ROUNDS=2; else ROUNDS=1; fi
  fi
  step compare "$limit" "$PY" benchmarks/gpu_reference.py --data "$DATA" "${rec[@]}" --device cuda \
    --rounds "$ROUNDS" --budget-s $(( limit > 15 ? limit - 10 : 5 )) --out "$OUT"
}

summary() {
  echo
  echo "== summary: $(now) s of the ${BUDGET} s budget; everything above is in $OUT"
  [ "$DRY" = 1 ] && return
  echo "pytest, issue 35's tests: $(pytest_line "$OUT/pytest_issue35.log")"
  echo "pytest, the other gpu tests: $(pytest_line "$OUT/pytest_rest.log")"
  grep -ho "issue35: .*" "$OUT/pytest_issue35.log" 2>/dev/null  # the figures the new tests print
  if [ -f "$OUT/run.log" ]; then
    grep -E "^recommended:|samples/s median|ceilings:|lever:|search done" "$OUT/run.log" | head -n 8
  fi
  if [ -f "$OUT/reference_table.txt" ]; then cat "$OUT/reference_table.txt"; else echo "no comparison table"; fi
  echo "logs kept: $(find "$OUT" -name 'trial-*.log' | wc -l) trials', $(find "$OUT" -name 'ceiling-*.log' | wc -l)" \
       "ceilings', $(find "$OUT" -name '*-round*.log' | wc -l) reference children's, in $OUT"
}

cleanup() {  # at exit: the JPEGs made here go; the logs stay; a compile cache is no log (it can be large)
  rm -rf "$WORK"
  find "$OUT" -mindepth 2 -maxdepth 2 -type d -name inductor-cache -exec rm -rf {} + 2>/dev/null
}

main() {
  set -u -o pipefail
  parse_args "$@"
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  cd "$ROOT" || exit 2
  { [ -f pyproject.toml ] && [ -d autotune ]; } || { echo "gpu_host.sh: $ROOT is not the project root" >&2; exit 2; }
  find_python
  OUT=${OUT:-$ROOT/gpu-host-out}
  mkdir -p "$OUT" || exit 2
  OUT=$(cd "$OUT" && pwd)
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-host.XXXXXX") || exit 2
  trap cleanup EXIT
  DATA=${GPU_HOST_DATA:-$WORK/jpegs}
  DB="$OUT/gpu.db"  # the study's folder (every trial's and ceiling's log) is made beside it: kept in $OUT
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # autotune and tests/ importable even if pip fails
  exec > >(tee -a "$OUT/gpu_host.log") 2>&1
  trap on_signal INT TERM

  echo "== gpu_host.sh at $(date -u +%FT%TZ) on $(hostname), $(nproc) cores; budget ${BUDGET} s; output in $OUT"
  echo "   project $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '(not a git checkout)'), data $DATA"
  needs
  [ "$DRY" = 1 ] || [ "$NEED_PY" = 1 ] || { echo "gpu_host.sh: no Python to run anything with"; exit 3; }
  machine
  install_autotune
  if [ -n "${GPU_HOST_DATA:-}" ]; then
    echo "== jpegs: using GPU_HOST_DATA=$DATA"
  else
    step jpegs "$(limit_for 75 300)" "$PY" benchmarks/make_jpegs.py "$DATA" --count "$JPEGS" --classes 10 \
      --size 320x240
  fi
  pytest_setup
  [ "$HAVE_AUTOTUNE" = 1 ] && tune
  compare
  local ids=() deselect=() t rest
  for t in "${NEW_TESTS[@]}"; do ids+=("$GPU_TESTS::$t"); deselect+=(--deselect "$GPU_TESTS::$t"); done
  if [ "$PYTEST_OK" = 1 ]; then
    step pytest_issue35 "$(limit_for 180 5)" "${PYTEST[@]}" "${ids[@]}"
    rest=$(limit_for 600 5)
    if (( rest >= 30 )); then
      step pytest_rest "$rest" "${PYTEST[@]}" "$GPU_TESTS" "${deselect[@]}"
    else
      echo "== pytest_rest: skipped, $(left) s left of the ${BUDGET} s budget (GPU_HOST_BUDGET_S=840 runs all of it)"
    fi
  fi
  keeps
  summary
  exit 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
