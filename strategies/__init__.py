"""Built-in strategy templates (TOML data only; installed as ``optuna_saturn._builtin_strategies``)."""
