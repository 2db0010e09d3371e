"""A failed trial's log in the user's artifact store (``artifact_store=``): its tail, where the error is."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import optuna

from optuna_saturn.study.records import ATTR

_logger = optuna.logging.get_logger("optuna.saturn")

#: How much of a failed trial's log is uploaded to the artifact store (its end, where the error is).
LOG_TAIL_BYTES = 1 << 20


def uploaded_log(artifact_store: Any, trial: optuna.Trial, log: Path) -> dict[str, Any]:
    """Upload the last :data:`LOG_TAIL_BYTES` of a failed trial's log to ``artifact_store``; the record that names
    it. Everyone who reads the storage may read it, so only its tail (where the error is) goes there; the whole
    log stays in the sweep's private log folder. A store that fails costs the upload, not the result."""
    if artifact_store is None or not log.exists():
        return {}
    from optuna.artifacts import upload_artifact

    try:
        with log.open("rb") as source, tempfile.TemporaryDirectory(prefix="saturn-log-") as folder:
            size = source.seek(0, os.SEEK_END)
            source.seek(max(0, size - LOG_TAIL_BYTES))
            tail = Path(folder) / log.name
            tail.write_bytes(source.read())
            artifact_id = upload_artifact(
                artifact_store=artifact_store, file_path=str(tail), study_or_trial=trial, mimetype="text/plain"
            )
    except Exception:
        _logger.warning(f"Could not upload trial {trial.number}'s log to the artifact store.", exc_info=True)
        return {}
    return {ATTR + "log_artifact_id": artifact_id}
