"""What a description imported of a library, the describer imports after it, so the next description's fork
starts with it (eight enqueued trials of the example took 10 s to describe, each fork importing the model's
classes again); the user's own modules it never imports."""

from __future__ import annotations

import json
import subprocess
import sys

#: In a fresh interpreter: a fork imports a standard-library module and a module of the user's, lists what it
#: imported, and the parent imports what it wrote.
SCRIPT = """
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from optuna_saturn.pools import learned_imports
path = tempfile.mkstemp()[1]
assert "xml.dom.minidom" not in sys.modules and "users_own" not in sys.modules
pid = os.fork()
if pid == 0:
    before = frozenset(sys.modules)
    import xml.dom.minidom, users_own
    learned_imports.write(path, learned_imports.library_modules_imported_since(before))
    os._exit(0)
os.waitpid(pid, 0)
imported = learned_imports.import_what_was_written(path)
print(json.dumps({"imported": imported, "minidom": "xml.dom.minidom" in sys.modules,
                  "users_own": "users_own" in sys.modules, "file_left": os.path.exists(path)}))
"""


def test_the_describer_imports_the_libraries_a_description_imported_and_never_the_users_modules(tmp_path):
    (tmp_path / "users_own.py").write_text("print('the user module ran')\n")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["minidom"] and "xml.dom.minidom" in found["imported"]
    assert not found["users_own"] and "users_own" not in found["imported"]
    assert not found["file_left"]


def test_the_describer_imports_them_with_the_gpus_hidden_as_the_description_had_them(tmp_path, monkeypatch):
    """A library that looks for GPUs at import (DeepSpeed picks its accelerator then) must find none in the
    describer, whose forks could not use CUDA once it held a context: it imports as the description did."""
    import os

    from optuna_saturn.pools import learned_imports

    (tmp_path / "looks_for_gpus.py").write_text("import os\nSEEN = os.environ.get('CUDA_VISIBLE_DEVICES')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    names = tmp_path / "names.json"
    learned_imports.write(str(names), ["looks_for_gpus"])
    assert learned_imports.import_what_was_written(str(names)) == ["looks_for_gpus"]
    assert sys.modules["looks_for_gpus"].SEEN == ""  # hidden while it imported
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # and back afterwards
    del sys.modules["looks_for_gpus"]
