from __future__ import annotations

import pytest

from optuna_saturn import SaturnExecutor, StrategyError
from optuna_saturn.devices import Device, available_cores, cpu_devices, pin_cores, resolve_devices
from optuna_saturn.pools.launch_commands import build_launch
from optuna_saturn.strategy import load_strategies, parse_strategy, select_strategies


def test_cpu_devices_split_cores_without_overlap():
    cores = available_cores()
    devices = cpu_devices(len(cores))
    assert [d.kind for d in devices] == ["cpu"] * len(cores)
    assert sorted(c for d in devices for c in d.cores) == cores


def test_cpu_workers_are_pinned_only_while_the_pool_leaves_the_executor_a_core(monkeypatch):
    monkeypatch.setattr("optuna_saturn.devices.available_cores", lambda: [0, 1, 2, 3])
    assert pin_cores([Device("cpu", 0, (0,)), Device("cpu", 1, (1,))])  # cores 2 and 3 are left
    assert not pin_cores([Device("cpu", i, (i,)) for i in range(4)])  # every core is a device's
    assert not pin_cores([Device("cpu", 0, (0, 1)), Device("cpu", 1, (2, 3))])
    assert pin_cores([Device("cuda", 0), Device("cuda", 1)])  # (GPU workers have no cores to pin)


def test_more_cpu_devices_than_cores_needs_consent():
    n = len(available_cores()) + 1
    with pytest.raises(ValueError, match="allow_shared_cores=True"):
        resolve_devices(n)
    assert len(resolve_devices(n, allow_shared_cores=True)) == n


@pytest.mark.parametrize(
    ("spec", "message"),
    [("gpu", "Unknown devices='gpu'"), ([], "empty list"), ([0], "CUDA device 0 does not exist"), (True, "bool")],
)
def test_bad_device_specs_name_the_fix(spec, message):
    with pytest.raises((ValueError, TypeError), match=message):
        resolve_devices(spec)


def test_builtin_strategies_load_and_allow_sane_device_counts():
    known = load_strategies()
    assert {"single", "ddp"} <= set(known)
    assert known["single"].device_counts(8) == [1]
    assert known["ddp"].device_counts(8) == [2, 4, 8]
    assert known["threads"].device_counts(4) == [2, 3, 4] and known["threads"].one_process
    assert all(s.accumulation_factors == (1, 2, 4, 8) for s in known.values())  # more only when out of memory


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"name": "x", "launcher": "torchrun", "engine": "ddp", "colour": "red"}, "unknown key"),
        ({"name": "x", "launcher": "mpirun", "engine": "ddp"}, "launcher 'mpirun'"),
        ({"name": "x", "launcher": "torchrun", "engine": "magic"}, "engine 'magic'"),
        ({"name": "x", "launcher": "torchrun", "engine": "ddp", "min_devices": 0}, "min_devices"),
        ({"name": "x", "launcher": "torchrun", "engine": "ddp", "min_devices": 4, "max_devices": 2}, "max_devices"),
        ({"name": "x", "launcher": "torchrun", "engine": "single", "max_devices": 2}, "max_devices = 1"),
        ({"launcher": "torchrun", "engine": "ddp"}, "'name' is required"),
        ({"name": "x", "launcher": "torchrun", "engine": "ddp", "one_process": True}, "one_process = true needs"),
        ({"name": "x", "launcher": "accelerate", "engine": "single", "one_process": True}, "launcher = 'torchrun'"),
        ({"name": "x", "launcher": "torchrun", "engine": "single", "one_process": "yes"}, "true or false"),
        (
            {"name": "x", "launcher": "torchrun", "engine": "ddp", "knobs": {"micro_batch": 4}},
            "unknown knob.*Known knobs",
        ),
        (
            {"name": "x", "launcher": "torchrun", "engine": "ddp", "knobs": {"gradient_accumulation": [4, 2]}},
            r"increasing list of positive ints, e.g. \[1, 2, 4, 8\]",
        ),
        (
            {"name": "x", "launcher": "torchrun", "engine": "ddp", "knobs": {"gradient_accumulation": 4}},
            "gradient_accumulation must be",
        ),
        (
            {"name": "x", "launcher": "torchrun", "engine": "fsdp", "knobs": {"activation_checkpointing": "yes"}},
            "true or false",
        ),
        (
            {"name": "x", "launcher": "deepspeed", "engine": "deepspeed", "knobs": {"cpu_offload": True}},
            "offload_optimizer",
        ),
        (
            {
                "name": "x",
                "launcher": "deepspeed",
                "engine": "deepspeed",
                "launcher_config": {"gradient_accumulation_steps": 4},
            },
            "knobs.gradient_accumulation",
        ),
    ],
)
def test_malformed_templates_are_rejected_with_the_reason(table, message):
    with pytest.raises(StrategyError, match=message):
        parse_strategy(table, source="my.toml")


def test_user_folder_adds_and_overrides_strategies(tmp_path):
    (tmp_path / "ddp4.toml").write_text('name = "ddp4"\nlauncher = "torchrun"\nengine = "ddp"\nmin_devices = 4\n')
    known = load_strategies(folders=[tmp_path])
    assert known["ddp4"].device_counts(6) == [4, 5, 6]
    (tmp_path / "broken.toml").write_text("name = \n")
    with pytest.raises(StrategyError, match="not valid TOML"):
        load_strategies(folders=[tmp_path])
    with pytest.raises(StrategyError, match="does not exist"):
        load_strategies(folders=[tmp_path / "missing"])


def test_unknown_or_impossible_strategies_are_reported():
    with pytest.raises(StrategyError, match=r"Unknown strategy 'zero9'.*Known strategies"):
        select_strategies(["zero9"], 2)
    with pytest.raises(StrategyError, match="ddp needs >= 2"):
        select_strategies(["ddp"], 1)
    with pytest.raises(StrategyError, match="list of names"):
        select_strategies("ddp", 2)  # type: ignore[arg-type]  # a wrong type on purpose: its error is tested
    with pytest.raises(StrategyError, match="Unknown strategy"):
        SaturnExecutor(devices=1, strategies=["nope"])


def test_one_process_strategies_are_for_cpu_devices_only():
    """On GPUs one process cannot use another device's cores: ``threads`` is refused when named. On CPU devices it
    is offered when named, and not by default (a cold sweep cannot find it yet; offering it costs start-up)."""
    assert "threads" in {s.name for s in select_strategies(["single", "threads"], 2)}
    assert "threads" not in {s.name for s in select_strategies(None, 2)}
    assert "threads" not in {s.name for s in select_strategies(None, 2, device_kind="cuda")}
    with pytest.raises(StrategyError, match="'threads' runs one process on the cores of several CPU devices"):
        select_strategies(["single", "threads"], 2, device_kind="cuda")


def test_launch_pins_devices_and_isolates_the_network():
    single = load_strategies()["single"]
    cpu = Device("cpu", 3, (3,))
    launch = build_launch(single, [cpu], "/tmp/spec.json", isolate_network=True)
    assert launch.command[:1] == ["unshare"] and "--net" in launch.command
    assert "--standalone" in launch.command and "--nproc-per-node=1" in launch.command
    assert launch.command[-1] == "/tmp/spec.json"
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "" and launch.env["OMP_NUM_THREADS"] == "1"
    gpus = build_launch(load_strategies()["ddp"], [Device("cuda", 2), Device("cuda", 5)], "/tmp/s.json")
    assert gpus.command[0] != "unshare" and "--nproc-per-node=2" in gpus.command
    assert gpus.env["CUDA_VISIBLE_DEVICES"] == "2,5"


def _deepspeed_launched(name: str = "zero2"):
    """A user's template that keeps DeepSpeed's own launcher (the shipped ones start workers with torchrun)."""
    return parse_strategy(
        {
            "name": name,
            "launcher": "deepspeed",
            "engine": "deepspeed",
            "min_devices": 2,
            "launcher_config": {"zero_optimization": {"stage": 2}},
        },
        source=name,
    )


def test_deepspeed_and_accelerate_command_lines(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    known = load_strategies()
    cpus = [Device("cpu", 0, (0,)), Device("cpu", 1, (1,))]
    assert "torch.distributed.run" in build_launch(known["zero2"], cpus, "/tmp/s.json").command
    ds = build_launch(_deepspeed_launched(), cpus, "/tmp/s.json")
    assert "deepspeed.launcher.runner" in ds.command and "--num_gpus=2" in ds.command
    assert "--no_local_rank" in ds.command and ds.command[-2:] == ["optuna_saturn.worker.launched", "/tmp/s.json"]
    assert "TORCH_EXTENSIONS_DIR" in ds.env  # compiled ops are cached across trials
    gpu_ds = build_launch(_deepspeed_launched(), [Device("cuda", 2), Device("cuda", 5)], "/tmp/s.json")
    assert "--include=localhost:2,5" in gpu_ds.command and "CUDA_VISIBLE_DEVICES" not in gpu_ds.env
    accelerate = parse_strategy({"name": "a", "launcher": "accelerate", "engine": "ddp", "min_devices": 2}, source="a")
    acc = build_launch(accelerate, cpus, "/tmp/s.json")
    assert "accelerate.commands.launch" in acc.command and "--multi_gpu" in acc.command
    assert "--num_processes=2" in acc.command and acc.env["ACCELERATE_USE_CPU"] == "1"


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate", "deepspeed"])
def test_gpus_under_a_parent_mask_map_to_the_masks_entries(monkeypatch, launcher):
    """SLURM or Kubernetes gave this process GPUs 4-7: its devices 0 and 1 are physical GPUs 4 and 5."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    gpus = [Device("cuda", 0), Device("cuda", 1)]
    strategy = (
        _deepspeed_launched()
        if launcher == "deepspeed"
        else parse_strategy({"name": "d", "launcher": launcher, "engine": "ddp", "min_devices": 2}, source="d")
    )
    launch = build_launch(strategy, gpus, "/tmp/s.json")
    if launcher == "deepspeed":  # the deepspeed launcher sees every GPU and is told the physical ones
        assert "--include=localhost:4,5" in launch.command and "CUDA_VISIBLE_DEVICES" not in launch.env
    else:
        assert launch.env["CUDA_VISIBLE_DEVICES"] == "4,5"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb, GPU-cccc")
    assert (
        build_launch(load_strategies()["ddp"], [Device("cuda", 2)], "/tmp/s.json").env["CUDA_VISIBLE_DEVICES"]
        == "GPU-cccc"
    )
    with pytest.raises(RuntimeError, match="launcher is 'torchrun'"):
        build_launch(_deepspeed_launched(), [Device("cuda", 0), Device("cuda", 1)], "/tmp/s.json")
    with pytest.raises(RuntimeError, match="not in this process's CUDA_VISIBLE_DEVICES"):
        build_launch(load_strategies()["ddp"], [Device("cuda", 3)], "/tmp/s.json")
