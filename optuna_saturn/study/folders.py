"""The folders a study owns on disk (its trials' checkpoints, its outbox of results not stored yet), named so that
no other study can share them.

Two storages may hold studies of one name (the command line's default is ``saturn``), and different names can
clean to one file name ("a b" and "a_b"). Folders named by the name alone were shared: one study's checkpoint
deleted the other's, or a retry resumed the other study's weights. So each study gets an id, stored in the study
(``saturn:folder``) the first time a sweep runs on it, and its folders are named by it.
"""

from __future__ import annotations

import uuid

import optuna

from optuna_saturn.study.gateway import ATTR
from optuna_saturn.study.outbox import retrying

FOLDER_ATTR = ATTR + "folder"


def safe(name: str) -> str:
    """``name`` as one file name: nothing but letters, digits and ``-_.+,``, and never ``.`` or ``..``."""
    cleaned = "".join(c if c.isalnum() or c in "-_.+," else "_" for c in name)
    return cleaned if cleaned.strip(".") else cleaned.replace(".", "_") or "_"


def study_folder(study: optuna.Study) -> str:
    """The name of ``study``'s own folders: its name, cleaned, and its id (created and stored on first use)."""

    def read() -> str | None:
        return study.user_attrs.get(FOLDER_ATTR)

    folder = retrying(read, what="read the study's folder name")
    if folder is None:
        folder = f"{safe(study.study_name)[:64]}-{uuid.uuid4().hex[:12]}"
        retrying(lambda: study.set_user_attr(FOLDER_ATTR, folder), what="store the study's folder name")
        folder = retrying(read, what="read the study's folder name")  # (a sweep that started at once wrote last)
    if not isinstance(folder, str) or safe(folder) != folder:
        raise ValueError(
            f"The study's {FOLDER_ATTR!r} attribute is {folder!r}: it must be one folder name (letters, "
            f"digits and -_.+, only, not '.' or '..'). Set it to one with "
            f"study.set_user_attr({FOLDER_ATTR!r}, NAME), or leave it to optuna-saturn."
        )
    return folder
