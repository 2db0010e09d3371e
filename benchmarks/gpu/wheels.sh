#!/usr/bin/env bash
# The wheels benchmarks/gpu/check.sh installs on the device machine, which reaches no package registry: what
# optuna-saturn needs there beyond its image (Python 3.12 with torch, transformers, accelerate, rich, typer, psutil,
# numpy, pandas, absl-py, markupsafe; see /work/.library/device/KINDS.md), and DeepSpeed without its compiled ops
# (pure Python: the ZeRO parts of the check) with its small dependencies. Every version comes from wheels.txt, where
# each is pinned: setup.sh installs them with --no-deps, so nothing resolves a version there. gurobipy is left out:
# imported only when used.
set -euo pipefail
cd "$(dirname "$0")/../.."
pins=$(grep -vE '^\s*(#|$)' benchmarks/gpu/wheels.txt)
if grep -vE '^[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+$' <<<"$pins"; then
    echo "wheels.txt: the lines above are not pinned (name==version)" >&2; exit 1
fi
rm -rf .gpu/wheels; mkdir -p .gpu/wheels
# shellcheck disable=SC2046
pip download -q --only-binary=:all: --no-deps --dest .gpu/wheels --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    $(grep -v '^deepspeed==' <<<"$pins")
# DeepSpeed publishes a source distribution only: built here without its ops (DS_BUILD_OPS=0), it is pure Python
DS_BUILD_OPS=0 pip wheel -q --no-deps --no-build-isolation --wheel-dir .gpu/wheels "$(grep '^deepspeed==' <<<"$pins")"
echo "wheels in .gpu/wheels: $(du -sh .gpu/wheels | cut -f1); then: run(command='bash benchmarks/gpu/check.sh', carry=['.gpu'])"
