"""How many devices of which kind a cluster's node gives a sweep, as ``devices=`` asks: read per node, the same
way for every pool kind whose nodes are not this machine (Ray's, SLURM's)."""

from __future__ import annotations

from optuna_saturn.devices import DeviceSpec


def kind_and_count(spec: DeviceSpec, cpus: int, gpus: int, node: str, *, runner: str) -> tuple[str, int]:
    """The kind and number of devices ``spec`` (``devices=``) asks of one cluster node of ``cpus`` CPUs and ``gpus``
    GPUs: ``"auto"``: every GPU, else one CPU device per CPU; ``"cpu"``: one per CPU; ``"cpu:N"`` or ``N``: N
    devices. ``node`` names the node and ``runner`` the pool in the errors."""
    if spec == "auto":
        return ("cuda", gpus) if gpus else ("cpu", cpus)
    if spec == "cpu":
        return "cpu", cpus
    if spec == "cuda":
        if not gpus:
            raise ValueError(f"devices='cuda' but {node} has no GPU. Use devices='auto'.")
        return "cuda", gpus
    if isinstance(spec, str) and spec.startswith("cpu:") and spec[4:].isdigit():
        kind, count = "cpu", int(spec[4:])
    elif isinstance(spec, int) and not isinstance(spec, bool):
        kind, count = ("cuda" if gpus else "cpu"), spec
    else:
        raise ValueError(
            f"With {runner}, devices is read per node: 'auto', 'cpu', 'cuda', 'cpu:N' or an int N, not {spec!r}."
        )
    have = gpus if kind == "cuda" else cpus
    if not 1 <= count <= have:
        what = "GPUs" if kind == "cuda" else "CPUs (a CPU device is at least one whole CPU)"
        raise ValueError(f"devices={spec!r} per node, but {node} has {have} {what}. Pass at most {have}.")
    return kind, count
