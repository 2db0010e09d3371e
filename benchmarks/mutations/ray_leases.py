"""Mutations of the Ray sweep's device leases: each device's actor leases its device on its node before it starts
for real, so that a Ray sweep and a local sweep on one machine take turns."""

from mutations import Mutation

_TESTS = "tests/test_ray_leases.py"
_LAUNCH = f"{_TESTS}::test_a_local_sweep_waits_for_the_devices_a_ray_sweep_on_its_machine_holds"
_ACTOR_STARTS = f"{_TESTS}::test_an_actor_starts_for_real_only_once_its_device_is_leased"
_POOL = f"{_TESTS}::test_the_pool_does_not_count_a_waiting_device_ready_says_who_holds_it_once_and_asks_again"
_BESIDE_LOCAL = (
    f"{_TESTS}::test_a_ray_device_a_local_sweep_holds_waits_said_once_while_the_ray_sweep_runs_on_the_others"
)

MUTATIONS: list[Mutation] = [
    Mutation(
        name="ray-actor-takes-no-lease",
        contract="a Ray sweep's actor leases its device on its node: a local sweep there waits for it",
        path="optuna_saturn/pools/ray_actor.py",
        old="            holder = self._lease.take()\n",
        new="            holder = None\n",
        tests=(_LAUNCH, _ACTOR_STARTS),
    ),
    Mutation(
        name="ray-actor-starts-before-its-lease",
        contract="an actor makes its CUDA context and imports only once its device is leased",
        path="optuna_saturn/pools/ray_actor.py",
        old=(
            "            holder = self._lease.take()\n            if holder is not None:\n"
            '                return {"waiting_for": holder}\n            self._runner = self._start()\n'
        ),
        new=(
            "            self._runner = self._start()\n            holder = self._lease.take()\n"
            '            if holder is not None:\n                return {"waiting_for": holder}\n'
        ),
        tests=(_ACTOR_STARTS,),
    ),
    Mutation(
        name="ray-pool-takes-waiting-for-ready",
        contract="a device whose actor waits for its lease is not ready, and is not a failed start; said once",
        path="optuna_saturn/pools/ray.py",
        old='if result is not None and "waiting_for" in result:',
        new="if False:",
        tests=(_BESIDE_LOCAL, _POOL),
    ),
    Mutation(
        name="ray-leases-env-not-passed",
        contract="the driver's OPTUNA_SATURN_LEASES (a folder, or off) holds for its actors",
        path="optuna_saturn/pools/ray.py",
        old='"leases": driver_leases(),',
        new='"leases": None,',
        tests=(_POOL,),
    ),
    Mutation(
        name="ray-actor-ignores-driver-leases",
        contract="an actor leases in the folder the driver names, or not at all where the driver turned leasing off",
        path="optuna_saturn/pools/ray_lease.py",
        old='        if config.get("leases") is not None:\n            os.environ[LEASES_ENV] = config["leases"]\n',
        new="",
        tests=(f"{_TESTS}::test_leasing_off_in_the_driver_holds_for_its_actors",),
    ),
    Mutation(
        name="ray-fellow-actors-wait",
        contract="one Ray sweep's actors of two nodes on one machine do not wait for each other's leases",
        path="optuna_saturn/pools/ray_lease.py",
        old="                shares_with=self._fellow,\n",
        new="",
        tests=(
            f"{_TESTS}::test_a_ray_sweeps_actors_share_a_machines_cores_but_another_sweeps_wait_and_a_successor_"
            "waits_quietly",
        ),
    ),
]
