"""Mutations of issue 46's shared node: MIG refused only inside the mask, NVML mapped to CUDA by PCI bus id, the
planner on free memory, and an out-of-memory beside another process kept for the sweep only."""

from mutations import Mutation

TESTS = "tests/test_shared_node.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="shared-node-mig-refused-only-inside-the-mask",
        contract="a GPU in MIG mode refuses the sweep only where the sweep would use it, not anywhere on the node",
        path="optuna_saturn/devices.py",
        old="partitioned = in_mig_mode(physical_gpus(whole))",
        new="partitioned = in_mig_mode([str(i) for i in range(64)])",
        tests=(f"{TESTS}::test_a_gpu_in_mig_mode_outside_the_mask_does_not_refuse_the_sweep",),
    ),
    Mutation(
        name="shared-node-nvml-index-in-pci-bus-order",
        contract="a mask's index entry is the GPU CUDA numbers so (PCI bus order), not NVML's index",
        path="optuna_saturn/nvml.py",
        old="return _pci_bus_order(pynvml)[int(entry)]",
        new="return pynvml.nvmlDeviceGetHandleByIndex(int(entry))",
        tests=(f"{TESTS}::test_an_index_entry_is_the_gpu_cuda_numbers_so_in_pci_bus_order_not_nvmls_index",),
    ),
    Mutation(
        name="shared-node-workers-number-gpus-in-pci-bus-order",
        contract="warm workers run with CUDA_DEVICE_ORDER=PCI_BUS_ID, the order NVML is mapped in",
        path="optuna_saturn/pools/launch_commands.py",
        old='"CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # (the order optuna_saturn.nvml maps',
        new='"CUDA_DEVICE_ORDER_UNSET": "",  # (the order optuna_saturn.nvml maps',
        tests=(f"{TESTS}::test_an_index_entry_is_the_gpu_cuda_numbers_so_in_pci_bus_order_not_nvmls_index",),
    ),
    Mutation(
        name="shared-node-launched-trials-number-gpus-in-pci-bus-order",
        contract="a launched trial's processes run with CUDA_DEVICE_ORDER=PCI_BUS_ID too",
        path="optuna_saturn/pools/launch_commands.py",
        old='"CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # (as worker_environment\'s)',
        new="",
        tests=(f"{TESTS}::test_a_launched_trials_processes_number_the_gpus_as_the_workers_do",),
    ),
    Mutation(
        name="shared-node-planner-on-free-memory",
        contract="the planner gives a GPU its memory less what other processes hold at the sweep's start",
        path="optuna_saturn/profiler/_hardware.py",
        old="    return held.total - held.others\n",
        new="    return held.total\n",
        tests=(f"{TESTS}::test_the_planner_plans_on_the_memory_other_processes_leave_and_says_so",),
    ),
    Mutation(
        name="shared-node-sweep-processes-are-not-others",
        contract="memory the sweep's own processes hold is not another process's",
        path="optuna_saturn/nvml.py",
        old="for p in listed if int(p.pid) not in own}",
        new="for p in listed}",
        tests=(f"{TESTS}::test_an_out_of_memory_on_a_gpu_nobody_else_holds_is_stored_as_the_options",),
    ),
    Mutation(
        name="shared-node-oom-beside-another-process-kept-for-the-sweep",
        contract="an out-of-memory while another process holds GPU memory is not stored in the profile store",
        path="optuna_saturn/pricing/sweep_store.py",
        old="shared = [] if record.feasible else (shared_gpus(self._pool) or self._shared_at_start)",
        new="shared: list[str] = []",
        tests=(f"{TESTS}::test_an_out_of_memory_beside_another_process_is_kept_for_this_sweep_only",),
    ),
    Mutation(
        name="shared-node-oom-after-a-shared-start-kept-for-the-sweep",
        contract="memory another process held at the sweep's start counts, even if it is gone at the out-of-memory",
        path="optuna_saturn/pricing/sweep_store.py",
        old="(shared_gpus(self._pool) or self._shared_at_start)",
        new="shared_gpus(self._pool)",
        tests=(f"{TESTS}::test_an_out_of_memory_beside_another_process_is_kept_for_this_sweep_only",),
    ),
    Mutation(
        name="shared-node-mixed-gpu-models-warned-of",
        contract="a pool of GPUs of different models is warned of (its profiles are keyed by the first GPU's model)",
        path="optuna_saturn/devices.py",
        old="    warn_of_mixed_models(devices)\n    return devices\n\n\ndef refuse_partitioned",
        new="    return devices\n\n\ndef refuse_partitioned",
        tests=(f"{TESTS}::test_a_pool_of_mixed_gpu_models_is_warned_of_with_the_fix",),
    ),
]
