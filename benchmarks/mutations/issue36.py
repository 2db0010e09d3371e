"""Mutations of issue 36's GPU contracts (placement, fork safety, silent deaths, out of memory on every rank)."""

from mutations import Mutation

MUTATIONS: list[Mutation] = [
    Mutation(
        name="local-rank-is-the-rank",
        contract="LOCAL_RANK is the ordinal of the one GPU a worker sees (0), not the job's rank",
        path="optuna_saturn/worker/gpu.py",
        old='"LOCAL_RANK": "0",',
        new='"LOCAL_RANK": str(rank),',
        tests=("tests/test_gpu_contracts.py::test_every_rank_sees_one_device_and_the_variables_a_launcher_sets",),
    ),
]
