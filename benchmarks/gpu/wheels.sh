#!/usr/bin/env bash
# The wheels benchmarks/gpu/check.sh installs on the device machine, which reaches no package registry: what
# optuna-saturn needs there beyond its image (Python 3.12 with torch, transformers, accelerate, rich, typer, psutil,
# numpy; see /work/.library/device/KINDS.md), and DeepSpeed without its compiled ops (pure Python: the ZeRO parts
# of review_checks.py) with its small dependencies. gurobipy is left out: imported only when used.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/wheels
pip download -q --only-binary=:all: --no-deps --dest .gpu/wheels --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    optuna==5.1.0 alembic==1.20.1 mako==1.4.3 colorlog==6.12.0 sqlalchemy==2.1.9 highspy==1.16.0 \
    ortools==9.15.6755 protobuf==6.33.6 immutabledict==4.3.1 nvidia-ml-py \
    hjson pydantic pydantic-core annotated-types typing-inspection py-cpuinfo msgpack einops
# DeepSpeed publishes a source distribution only: built here without its ops (DS_BUILD_OPS=0), it is pure Python
if ! ls .gpu/wheels/deepspeed-*.whl >/dev/null 2>&1; then
    DS_BUILD_OPS=0 pip wheel -q --no-deps --no-build-isolation --wheel-dir .gpu/wheels deepspeed==0.19.8
fi
echo "wheels in .gpu/wheels: $(du -sh .gpu/wheels | cut -f1); then: run(command='bash benchmarks/gpu/check.sh', carry=['.gpu'])"
