"""Mutations of issue 46 item 3: a model that fits only when sharded is never whole in a rank's host memory, and is
built with single's values (``optuna_saturn/engines/_sharded_build.py``)."""

from mutations import Mutation

_TEST = "tests/test_sharded_build.py::test_no_rank_holds_a_model_that_fits_only_halved_whole_in_host_memory"
FSDP, ZERO3 = f"{_TEST}[fsdp]", f"{_TEST}[zero3]"
TOUCHED = (
    "tests/test_sharded_build.py::test_code_that_touches_cut_parameters_while_the_model_is_built_sees_single_s_values"
)

MUTATIONS: list[Mutation] = [
    *(
        Mutation(
            name=f"sharded-build-off-{strategy}",
            contract=f"under {strategy} each module is cut to the rank's chunk as it is built, not built whole",
            path="optuna_saturn/engines/_base.py",
            old="if not self.shards_parameters or self.context.world_size == 1 or sharded_build_off():",
            new="if True:",
            tests=(test,),
        )
        for strategy, test in (("fsdp", FSDP), ("zero3", ZERO3))
    ),
    *(
        Mutation(
            name=f"prepared-model-gathered-whole-{strategy}",
            contract=f"trial.prepare hands {strategy} the chunks, not the model made whole again",
            path="optuna_saturn/engines/_sharded_build.py",
            old="                chunks[id(param)] = kept[1]",
            new="                self._cut_params[id(param)] = kept",
            tests=(test,),
        )
        for strategy, test in (("fsdp", FSDP), ("zero3", ZERO3))
    ),
    Mutation(
        name="fsdp-shards-not-filled",
        contract="FSDP's shards of a model cut as it was built hold the rank's chunk (single's values)",
        path="optuna_saturn/engines/_fsdp.py",
        old="                shard.to_local().copy_(chunk)",
        new="                pass",
        tests=(FSDP,),
    ),
    Mutation(
        name="zero3-gathers-every-parameter-first",
        contract="ZeRO-3 partitions a cut model one whole parameter at a time",
        path="optuna_saturn/engines/_deepspeed.py",
        old="one_by_one = whole_one_at_a_time(model, chunks, self.context.world_size, self.context.control_group)",
        new="one_by_one = iter(list(whole_one_at_a_time(model, chunks, self.context.world_size, "
        "self.context.control_group)))",
        tests=(ZERO3,),
    ),
    Mutation(
        name="zero3-without-zero-init",
        contract="ZeRO-3 partitions the model (zero.Init) before initialize, never placing it whole",
        path="optuna_saturn/engines/_deepspeed.py",
        old="model = self._partitioned(model, config) if self.shards_parameters else model.to(self.context.device)",
        new="model = model.to(self.context.device)",
        tests=(ZERO3,),
    ),
    Mutation(
        name="cut-parameter-touched-in-place",
        contract="code that touches a cut parameter while the model is built (Hugging Face's post_init) sees it whole",
        path="optuna_saturn/engines/_sharded_build.py",
        old="        if (self._cut_params or self._whole) and not self._busy and func not in _METADATA:",
        new="        if False:",
        tests=(FSDP,),
    ),
    Mutation(
        name="whole-parameters-cut-again-by-age",
        contract="parameters made whole are cut again least recently touched first (a view in use stays whole)",
        path="optuna_saturn/engines/_sharded_build.py",
        old="                self._whole[key] = self._whole.pop(key)",
        new="                pass",
        tests=(TOUCHED,),
    ),
]
MUTATIONS += [
    Mutation(
        name="sharded-build-cannot-be-turned-off",
        contract="OPTUNA_SATURN_SHARDED_BUILD=off builds the model whole on every rank (rank-dependent code)",
        path="optuna_saturn/engines/_base.py",
        old=" or sharded_build_off():",
        new=":",
        tests=("tests/test_sharded_build.py -k sharded_build_off",),
    )
]
MUTATIONS += [
    Mutation(
        name="cut-parameter-known-by-id-alone",
        contract="a tensor that gets a dropped cut parameter's id is not gathered as that parameter",
        path="optuna_saturn/engines/_sharded_build.py",
        old="        if kept[0]() is tensor:\n            return True",
        new="        if True:\n            return True",
        tests=("tests/test_sharded_build.py -k dropped",),
    )
]
