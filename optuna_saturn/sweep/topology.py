"""The pool's devices grouped by node, for the sweep: the planner works on nodes and node-local device indices
(:class:`~optuna_saturn.planner.Cluster`), the sweep and the pools on one global index per device. A trial's
devices are always on one node (its process group stays inside a machine)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from optuna_saturn.devices import Device
from optuna_saturn.planner import Assignment, Cluster, Reservation


@dataclass(frozen=True)
class Topology:
    """``members[n]``: the global indices of node ``n``'s devices, in order."""

    members: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, devices: Sequence[Device], *, without: Collection[int] = ()) -> Topology:
        """``devices`` by node, in order, leaving out the devices ``without`` (a node left with none is gone)."""
        names: list[str] = []
        members: dict[str, list[int]] = {}
        for i, device in enumerate(devices):
            if i in without:
                continue
            if device.node not in members:
                names.append(device.node)
                members[device.node] = []
            members[device.node].append(i)
        return cls(tuple(tuple(members[n]) for n in names))

    @cached_property
    def cluster(self) -> Cluster:
        return Cluster([len(m) for m in self.members])

    @cached_property
    def largest_node(self) -> int:
        return max(self.cluster.nodes)

    @cached_property
    def _nodes(self) -> dict[int, int]:
        return {d: n for n, m in enumerate(self.members) for d in m}

    @cached_property
    def _locals(self) -> dict[int, int]:
        return {d: i for m in self.members for i, d in enumerate(m)}

    def node_of(self, device: int) -> int:
        return self._nodes[device]

    def to_global(self, assignment: Assignment) -> Assignment:
        """A planner's assignment (node-local devices) with the pool's global device indices."""
        members = self.members[assignment.node]
        return replace(assignment, devices=tuple(members[d] for d in assignment.devices))

    def to_local(self, assignment: Assignment) -> Assignment:
        """The inverse of :meth:`to_global`. The node is found from the (global) devices: node indices shift when
        a node is gone, device indices never do."""
        a = assignment
        return Assignment(
            a.job, a.option, self._nodes[a.devices[0]], tuple(self._locals[d] for d in a.devices), a.start, a.end
        )

    def reservation(self, devices: Sequence[int], until: float, job: str = "") -> Reservation:
        """Global devices a running job holds, as the planner reserves them."""
        node = self.node_of(devices[0])
        return Reservation(node, self._local(node, devices), until, job)

    def pick(self, usable: Collection[int], count: int) -> list[int] | None:
        """``count`` of the ``usable`` devices on one node (the node with the fewest left over: whole nodes stay
        free for larger trials), or None when no node has that many."""
        if count < 1:
            return None
        by_node: dict[int, list[int]] = {}
        for d in usable:
            node = self._nodes.get(d)
            if node is not None:
                by_node.setdefault(node, []).append(d)
        fits = [(len(f), node, sorted(f)) for node, f in by_node.items() if len(f) >= count]
        return min(fits)[2][:count] if fits else None

    def _local(self, node: int, devices: Sequence[int]) -> tuple[int, ...]:
        return tuple(self._locals[d] for d in devices)
