#!/usr/bin/env bash
# Makes the venv $V for the GPU check: the base interpreter's packages (torch, transformers, ...) plus the carried
# wheels plus optuna-saturn (editable; a copy if that cannot build offline). Called by check.sh.
# The device's python3 is itself a venv (/opt/torch/.venv), so --system-site-packages alone would miss its
# packages: a .pth file adds every site dir of $PY after the new venv's own (so the carried wheels win).
set -eu
PY=${PY:-python3} V=${V:-/tmp/v} WHEELS=${WHEELS:-.gpu/wheels}
rm -rf "$V"
if [ "${GPU_CHECK_NO_VENV:-0}" != 1 ] && "$PY" -m venv --without-pip --system-site-packages "$V"; then
  site=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PY" - "$site/_base_site.pth" <<'EOF'
import os, site, sys
import torch
dirs = [*site.getsitepackages(), os.path.dirname(os.path.dirname(torch.__file__))]
dirs = [d for i, d in enumerate(dirs) if os.path.isdir(d) and d not in dirs[:i]]
with open(sys.argv[1], "w") as f:
    f.write("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs) + "\n")
print("base site dirs:", dirs)
EOF
else  # no venv: install into $PY's own environment (the device machine is thrown away afterwards)
  echo "no venv (GPU_CHECK_NO_VENV=${GPU_CHECK_NO_VENV:-0}, or venv failed): installing into $PY's environment"
  real=$("$PY" -c 'import sys; print(sys.executable)')
  mkdir -p "$V/bin"; printf '#!/bin/sh\nexec %s "$@"\n' "$real" >"$V/bin/python"; chmod +x "$V/bin/python"
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
fi
"$V/bin/python" -m pip --version
"$V/bin/python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$WHEELS"/*.whl
# --no-deps checks nothing: an import that breaks (a pydantic-core that does not match pydantic, say) is said here,
# loudly, and each DeepSpeed part of the review FAILs with the reason (checks_common.deepspeed_import), never SKIPs.
if "$V/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("deepspeed") is None)'; then
  if ds=$(cd /tmp && DS_ACCELERATOR=cuda PYTORCH_NVML_BASED_CUDA_CHECK=1 "$V/bin/python" -c \
      'import deepspeed; print(deepspeed.__version__)' 2>&1); then
    echo "import deepspeed: OK ($(tail -1 <<<"$ds"))"
  else
    echo "IMPORT DEEPSPEED FAILED (every DeepSpeed part will FAIL): $(tail -1 <<<"$ds")"
  fi
else
  echo "DeepSpeed is not installed: its parts will SKIP (are the wheels of benchmarks/gpu/wheels.sh in $WHEELS?)"
fi
err=${GPU_CHECK_WORK:-/tmp}/editable.err
if "$V/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir -e . 2>"$err"; then
  echo "optuna-saturn: editable install OK"
else
  tail -5 "$err"
  # The source tree on sys.path, with the package's one mapped subpackage (strategies/ installs as
  # optuna_saturn._builtin_strategies) linked in place; check.sh removes the link at the end.
  echo "optuna-saturn: editable install failed; using the source tree through a .pth file instead"
  echo "$PWD" >"$site/optuna_saturn_src.pth"
  if [ ! -e optuna_saturn/_builtin_strategies ]; then
    ln -s ../strategies optuna_saturn/_builtin_strategies && touch "${GPU_CHECK_WORK:-/tmp}/linked-builtin-strategies"
  fi
fi
# DeepSpeed's ops the check's ZeRO parts need (cpu_adam on a GPU), built now rather than inside a part's time
"$V/bin/python" benchmarks/gpu/build_ops.py || echo "building DeepSpeed's ops failed: the ZeRO parts build them"
cd /tmp
"$V/bin/python" -c 'import optuna, optuna_saturn, torch
from optuna_saturn import SaturnExecutor
from optuna_saturn.strategy import load_strategies
print("import OK: optuna", optuna.__version__, "| optuna_saturn", optuna_saturn.__file__, "| torch", torch.__version__,
      "| strategies", sorted(load_strategies()))'
