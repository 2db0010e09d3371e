"""How the paper-like target depends on the cost model: the best reduction any plan can reach, per model variant.

For each variant of the constants in ``workloads.py`` this prints the lower bound, the two baselines, and
``1 - lower bound / better baseline``: no planner can beat the better baseline by more than that on that variant
(the planner's plans are within ~1% of the bound, section 1 of the README). A second table scans the two least
certain constants (the MFU fall-off at small micro-batches, the comm/compute overlap) together.
Usage: ``python benchmarks/cost_model_sensitivity.py`` (a few seconds; no solver runs).
"""

import contextlib

import _common  # noqa: F401
import workloads
from workloads import markdown_table, paper_like

from optuna_saturn.planner import Cluster, lower_bound, solve

VARIANTS = [
    ("as documented in workloads.py", {}),
    ("MFU independent of micro-batch", {"MFU_HALF_TOKENS": 0}),
    ("MFU half-saturation at 2048 tokens", {"MFU_HALF_TOKENS": 2048}),
    ("MFU half-saturation at 4096 tokens", {"MFU_HALF_TOKENS": 4096}),
    ("no comm/compute overlap", {"OVERLAP": 0.0}),
    ("bus bandwidth 75 GB/s", {"BUS_BANDWIDTH": 75e9}),
    ("collective latency 100 us", {"COLLECTIVE_LATENCY": 100e-6}),
    ("no overlap + 75 GB/s + 100 us", {"OVERLAP": 0.0, "BUS_BANDWIDTH": 75e9, "COLLECTIVE_LATENCY": 100e-6}),
    ("startup 300 s", {"STARTUP_SECONDS": 300.0}),
]


@contextlib.contextmanager
def patched(values: dict):
    old = {k: getattr(workloads, k) for k in values}
    try:
        for k, v in values.items():
            setattr(workloads, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(workloads, k, v)


def evaluate(values: dict) -> tuple[float, float, float]:
    """(lower bound, sequential-max, task-parallel) makespans in seconds for the paper-like workload."""
    with patched(values):
        jobs = paper_like()
    cluster = Cluster([8])
    return (
        lower_bound(jobs, cluster),
        solve(jobs, cluster, "sequential-max").makespan,
        solve(jobs, cluster, "task-parallel").makespan,
    )


def main() -> None:
    rows = []
    for name, values in VARIANTS:
        lb, seq, tp = evaluate(values)
        rows.append([name, lb / 3600, seq / 3600, tp / 3600, seq / lb, f"{100 * (1 - lb / min(seq, tp)):.1f}%"])
    print(
        "Paper-like workload, one 8-GPU node. Reduction = 1 - lower bound / better baseline (an upper bound on "
        "what any plan reaches).\n"
    )
    print(
        markdown_table(
            [
                "cost-model variant",
                "lower bound (h)",
                "sequential-max (h)",
                "task-parallel (h)",
                "sequential-max / LB",
                "best possible reduction",
            ],
            rows,
        )
    )
    # The two baselines pull in opposite directions: a steeper MFU fall-off at small micro-batches hurts
    # sequential-max (1-2 sequences per GPU) but favours task-parallel (one GPU, large micro-batches).
    grid = []
    for half in (0, 512, 1024, 2048, 4096, 8192, 16384):
        row = [half]
        for overlap in (0.5, 0.0):
            lb, seq, tp = evaluate({"MFU_HALF_TOKENS": half, "OVERLAP": overlap})
            row.append(f"{100 * (1 - lb / min(seq, tp)):.1f}% ({'seq' if seq < tp else 'tp'})")
        grid.append(row)
    print(
        "\nBest possible reduction vs the better baseline (seq = sequential-max, tp = task-parallel), over the MFU "
        "half-saturation and the comm/compute overlap:\n"
    )
    print(markdown_table(["MFU half-saturation (tokens)", "overlap 0.5 (documented)", "no overlap"], grid))


if __name__ == "__main__":
    main()
