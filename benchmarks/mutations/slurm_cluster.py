"""Mutations of the test SLURM cluster (``tests/slurm_cluster.py``): each undoes one thing the cluster needs to be
real (a node named by its own host, one munge socket for all, a node lost seen DOWN in bounded time)."""

from mutations import Mutation

_TEST = (
    "tests/test_slurm_cluster.py::test_two_slurm_nodes_run_jobs_on_their_own_hosts_and_a_killed_slurmd_is_seen_down",
)

MUTATIONS: list[Mutation] = [
    Mutation(
        name="slurmd-without-its-hostname",
        contract="each slurmd runs in a UTS namespace whose hostname is its NodeName (distinct hosts, srun hostname)",
        path="tests/slurm_cluster.py",
        old='_in_namespace(cluster.node_namespaces[name], name, ["slurmd", "-f", cluster.conf])',
        new='_in_namespace(cluster.node_namespaces[name], None, ["slurmd", "-f", cluster.conf])',
        tests=_TEST,
    ),
    Mutation(
        name="slurm-without-its-munge-socket",
        contract="every SLURM daemon and client authenticates through the cluster's own munged (AuthInfo=socket)",
        path="tests/slurm_cluster.py",
        old='f"AuthInfo=socket={f}/run/munge.socket",',
        new="",
        tests=_TEST,
    ),
    Mutation(
        name="slurmd-timeout-default",
        contract="a node whose slurmd is killed is DOWN within a bounded time (SlurmdTimeout short)",
        path="tests/slurm_cluster.py",
        old='f"SlurmdTimeout={SLURMD_TIMEOUT_S}",',
        new='"SlurmdTimeout=300",',
        tests=_TEST,
    ),
]
