"""The plug-in's strategy templates (read by optuna-saturn as its entry point names this package)."""
