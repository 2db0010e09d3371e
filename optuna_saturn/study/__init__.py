"""Everything a sweep says to the user's Optuna study."""
