#!/usr/bin/env bash
# The wheels benchmarks/gpu/check.sh installs on the device machine, which reaches no package registry: what
# optuna-saturn needs there beyond its image (Python 3.12 with torch, transformers, accelerate, rich, typer, psutil,
# numpy; see /work/.library/device/KINDS.md). gurobipy and deepspeed are left out: imported only when used.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/wheels
pip download -q --only-binary=:all: --no-deps --dest .gpu/wheels --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    optuna==5.1.0 alembic==1.20.1 mako==1.4.3 colorlog==6.12.0 sqlalchemy==2.1.9 highspy==1.16.0 \
    ortools==9.15.6755 protobuf==6.33.6 immutabledict==4.3.1
echo "wheels in .gpu/wheels: $(du -sh .gpu/wheels | cut -f1); then: run(command='bash benchmarks/gpu/check.sh', carry=['.gpu'])"
