from __future__ import annotations

import os
import shutil

import pytest
from support import require

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests run sweeps that share devices on purpose (two sweeps on one study, a sweep killed while another runs):
# device leases are off for them, and on in the tests of leases themselves (tests/test_leases.py).
os.environ.setdefault("OPTUNA_SATURN_LEASES", "off")


def _can_isolate_network() -> bool:
    return shutil.which("unshare") is not None and shutil.which("ip") is not None


@pytest.fixture
def saturn_options(tmp_path):
    """Executor options for tests: every launch inside its own loopback-only network namespace (DESIGN 9)."""
    require(
        _can_isolate_network(),
        "unshare or ip (util-linux, iproute2)",
        fix="install them: trials launch in a loopback-only network namespace (DESIGN.md, decision 9)",
    )
    return {
        "isolate_network": True,
        "log_dir": tmp_path / "runs",
        "grace_period": 5.0,
        "profile_store": tmp_path / "profiles",
        "progress": "plain",
        "dashboard": False,
    }


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request, tmp_path):
    """A study's storage URL: a SQLite file, or a fresh database on PostgreSQL (the server .ci/run started)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'study.sqlite3'}"
        return
    from postgres import postgres_database

    with postgres_database() as url:
        yield url
