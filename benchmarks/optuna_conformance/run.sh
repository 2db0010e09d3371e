#!/usr/bin/env bash
# Optuna's own tests of Study.optimize (and of Trial through it), with Study.optimize routed through
# SaturnExecutor (conftest.py beside this file; read its docstring).
#
#   bash benchmarks/optuna_conformance/run.sh [extra pytest args]     (from the repository root)
#
# Optuna's tests come from its sdist on PyPI (optuna==<installed version>, which ships tests/). They, and this
# conftest, are copied into a scratch folder ($RUN); nothing is written into the repository. Optuna's
# optuna.testing.storages imports fakeredis (its journal_redis storage mode, whose Lua scripts need lupa: the
# "lua" extra), which the project's venv lacks: it is installed into $DEPS (not into the venv) and put on
# PYTHONPATH.
#
# OPTUNA_CONFORMANCE_BASELINE=1: the same tests on Optuna's own Study.optimize (the reference run).
# OPTUNA_CONFORMANCE_DEVICES=1: the executor on one device (trials one at a time, as n_jobs=1; default 2).
# FILES (space-separated, relative to Optuna's tests/) overrides the default selection below; RUN the scratch
# folder (report: $RUN/report.json); TIMEOUT the run's limit in seconds (default 1500).
#
# The whole selection takes ~18 min on 2 cores (the reference run, OPTUNA_CONFORMANCE_BASELINE=1: ~3 min). In three
# runs, as measured (6 + 10 + 2 min):
#   RUN=/tmp/conf-A FILES=study_tests/test_study.py bash benchmarks/optuna_conformance/run.sh -k optimize_parallel
#   RUN=/tmp/conf-B FILES=study_tests/test_study.py bash benchmarks/optuna_conformance/run.sh -k "not optimize_parallel"
#   RUN=/tmp/conf-C FILES="study_tests/test_optimize.py trial_tests/test_trial.py trial_tests/test_frozen.py \
#     study_tests/test_dataframe.py test_callbacks.py" bash benchmarks/optuna_conformance/run.sh
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
. "$ROOT/.venv/bin/activate"
VERSION="$(python -c 'import optuna; print(optuna.__version__)')"
SRC="${OPTUNA_SRC:-/tmp/optuna-src}"
DEPS="${OPTUNA_TEST_DEPS:-/tmp/optuna-deps}"
RUN="${RUN:-/tmp/optuna-conformance-run}"

if [ ! -d "$SRC/tests" ]; then
  mkdir -p "$SRC"
  pip download "optuna==$VERSION" --no-binary :all: --no-deps -d "$SRC"
  tar -xzf "$SRC/optuna-$VERSION.tar.gz" -C "$SRC"
  mv "$SRC/optuna-$VERSION/tests" "$SRC/tests"
fi
python -c "import sys; sys.path.insert(0, '$DEPS'); import fakeredis, lupa" 2>/dev/null \
  || pip install --target "$DEPS" "fakeredis[lua]"

# Study.optimize itself: test_study.py (its optimize tests), test_optimize.py (Optuna 5 tests _optimize._run_trial
# there, never Study.optimize: every one passes without the executor), test_callbacks.py (MaxTrialsCallback).
# Trial through optimize: trial_tests/test_trial.py (most construct Trial directly), test_frozen.py (one test).
# Results of optimize as data: study_tests/test_dataframe.py.
FILES="${FILES:-study_tests/test_study.py study_tests/test_optimize.py trial_tests/test_trial.py trial_tests/test_frozen.py study_tests/test_dataframe.py test_callbacks.py}"

rm -rf "$RUN" && mkdir -p "$RUN"
cp -r "$SRC/tests" "$RUN/tests"
cp "$HERE/conftest.py" "$RUN/conftest.py"
cd "$RUN"
TARGETS=()
for f in $FILES; do TARGETS+=("tests/$f"); done

# The machine is shared with timing benchmarks: wait for them to end.
while pgrep -f short_trials.py >/dev/null || pgrep -f vs_optuna.py >/dev/null; do sleep 20; done

export PYTHONPATH="$DEPS${PYTHONPATH:+:$PYTHONPATH}"
export OPTUNA_CONFORMANCE_REPORT="${OPTUNA_CONFORMANCE_REPORT:-$RUN/report.json}"
export OPTUNA_CONFORMANCE_SCRATCH="$RUN"  # (the executors' logs: $RUN/executors-*/call-N/runs/...)
timeout "${TIMEOUT:-1500}" python -m pytest -p no:cacheprovider --rootdir="$RUN" -q -rf --durations=10 \
  -o addopts= "${TARGETS[@]}" "$@"
