"""An engine from outside optuna-saturn: DDP under a name of its own, which marks the model it prepares so a test
can see that it, and not the package's DDP, ran the trial. Declared by its traits (the entry point names them)."""

from optuna_saturn.engines import DDPEngine, DDPTraits


class MarkingDDPEngine(DDPEngine):
    def prepare_model(self, model):
        model.prepared_by = "demo-ddp"  # on the user's module, before DDP wraps it
        return super().prepare_model(model)


class MarkingDDPTraits(DDPTraits):
    engine = "saturn_plugin_demo.engine:MarkingDDPEngine"
