"""A plug-in of optuna-saturn from outside its package: a pool kind, strategies, and an engine."""
