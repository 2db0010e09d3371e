"""What the sweep writes to the study, and how it stays live and right when others write there too: the heartbeat
beats while a slow sampler holds the study's lock, results ended by someone else are kept and said, refused or
too long values fail the trial instead of the sweep, and nothing unbounded goes to the storage (reliability
review, findings 4, 12, 17 and 19)."""

from __future__ import annotations

import threading
import time

import optuna
import pytest
import sqlalchemy.exc
from optuna.trial import TrialState

from optuna_saturn.study import liveness, moves
from optuna_saturn.study.gateway import FAIL_REASON_CHARS, StudyGateway
from optuna_saturn.study.log_artifacts import LOG_TAIL_BYTES
from optuna_saturn.study.outbox import Outbox, retrying, transient


def _beat_count(storage: str, study_name: str, key: str) -> int:
    beat = optuna.load_study(study_name=study_name, storage=storage).user_attrs.get(key)
    return beat["beat"] if beat else 0


def test_the_heartbeat_beats_while_a_slow_sampler_holds_the_study_lock(tmp_path, monkeypatch):
    """Relative sampling runs under the study's lock at a trial's first suggest; a GP sampler on a large study
    thinks for tens of seconds there. The beat must go on meanwhile (finding 4: it stopped for the whole call)."""
    monkeypatch.setattr(liveness, "HEARTBEAT_SECONDS", 0.05)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=storage)
    gateway = StudyGateway(study, owner={"sweep": "me"})
    gateway.ask_new()
    key = "saturn:heartbeat:me"
    with liveness.Heartbeat(gateway, "me"), gateway.lock:  # (what a slow sampler does)
        first = _beat_count(storage, study.study_name, key)
        deadline = time.monotonic() + 20.0
        while _beat_count(storage, study.study_name, key) < first + 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        beats = _beat_count(storage, study.study_name, key)
    assert beats >= first + 3, f"no beat while the study's lock was held ({first} -> {beats})"
    final = optuna.load_study(study_name=study.study_name, storage=storage).user_attrs[key]
    assert final is None  # the end is recorded too


def test_a_result_ended_first_by_a_plain_study_tell_is_kept_and_said(tmp_path, caplog):
    """Someone told the trial from optuna-dashboard or a notebook, with no ``saturn:ended_by``: the sweep's own
    result is kept as a late result and logged, not dropped in silence (finding 19)."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=storage)
    gateway = StudyGateway(study, owner={"sweep": "me"}, outbox=Outbox(tmp_path / "outbox"))
    trial = gateway.ask_new()
    trial.set_user_attr("saturn:owner", {"sweep": "me"})
    optuna.load_study(study_name=study.study_name, storage=storage).tell(trial.number, 0.25)
    with caplog.at_level("ERROR", logger="optuna.saturn"):
        frozen = gateway.tell(trial, TrialState.COMPLETE, [0.75])
    assert frozen.values == [0.25]  # the storage's word stands
    assert study.user_attrs[f"saturn:late_result:{trial.number}"]["values"] == [0.75]
    assert "someone outside this sweep" in caplog.text and "0.75" in caplog.text
    assert list((tmp_path / "outbox" / "late").glob("*.json"))  # on disk too, where no recovery clears it


def test_a_long_fail_reason_is_capped_with_its_start_and_its_error(tmp_path):
    """A library's error can print megabytes; the study keeps the start and the end, within about 2 KB (finding
    17)."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    gateway = StudyGateway(study)
    reason = "Traceback (most recent call last):\n" + "  frame\n" * 50_000 + "ValueError: the real error"
    frozen = gateway.fail(gateway.ask_new(), reason)
    kept = frozen.system_attrs["saturn:fail_reason"]
    assert len(kept) <= FAIL_REASON_CHARS
    assert kept.startswith("Traceback") and kept.endswith("ValueError: the real error")
    assert "characters left out" in kept


def test_only_the_tail_of_a_failed_trials_log_is_uploaded(tmp_path):
    """Everyone who reads the storage reads the artifact: its end (the error) goes there, not a whole log of
    gigabytes (finding 17)."""
    from optuna.artifacts import FileSystemArtifactStore, download_artifact

    (tmp_path / "artifacts").mkdir()
    store = FileSystemArtifactStore(str(tmp_path / "artifacts"))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    log = tmp_path / "trial-0.log"
    log.write_bytes(b"x" * (3 * LOG_TAIL_BYTES) + b"\nRuntimeError: at the end\n")
    gateway = StudyGateway(study, artifact_store=store)
    frozen = gateway.tell(gateway.ask_new(), TrialState.FAIL, attrs={"fail_reason": "boom"}, log=log)
    download_artifact(
        artifact_store=store, artifact_id=frozen.system_attrs["saturn:log_artifact_id"], file_path=str(tmp_path / "got")
    )
    got = (tmp_path / "got").read_bytes()
    assert len(got) == LOG_TAIL_BYTES and got.endswith(b"RuntimeError: at the end\n")


def _internal_error(cause: BaseException) -> optuna.exceptions.StorageInternalError:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from inner
    except optuna.exceptions.StorageInternalError as exc:
        return exc


def test_only_errors_of_a_storage_that_may_answer_again_are_retried():
    """Optuna wraps every SQLAlchemy error of a commit in StorageInternalError, a value too long for its column
    included: that one is raised at once, not retried for two minutes (finding 12)."""
    outage = _internal_error(sqlalchemy.exc.OperationalError("INSERT", {}, Exception("server closed the connection")))
    too_long = _internal_error(sqlalchemy.exc.DataError("INSERT", {}, Exception("Data too long for column")))
    assert transient(outage) and not transient(too_long)
    assert transient(sqlalchemy.exc.OperationalError("SELECT", {}, Exception("database is locked")))
    calls = []

    def refuse() -> None:
        calls.append(1)
        raise too_long

    started = time.monotonic()
    with pytest.raises(optuna.exceptions.StorageInternalError):
        retrying(refuse, what="write a value")
    assert calls == [1] and time.monotonic() - started < 1.0


def test_grpc_proxy_outages_are_retried_and_its_other_errors_are_not():
    """A gRPC storage proxy that restarts answers UNAVAILABLE: retried, like a database's outage (finding 12)."""
    import grpc

    class Unavailable(grpc.RpcError):
        def __init__(self, code: grpc.StatusCode) -> None:
            self._code = code

        def code(self) -> grpc.StatusCode:
            return self._code

    assert transient(Unavailable(grpc.StatusCode.UNAVAILABLE))
    assert not transient(Unavailable(grpc.StatusCode.INVALID_ARGUMENT))
    attempts = []

    def blip() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise Unavailable(grpc.StatusCode.UNAVAILABLE)
        return "answered"

    assert retrying(blip, what="read") == "answered" and len(attempts) == 3


def test_a_value_too_long_for_the_storage_fails_the_trial_not_the_sweep(tmp_path, monkeypatch):
    """A permanent data error while telling (MySQL's TEXT limit, say) fails that trial with the reason, at once."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    gateway = StudyGateway(study)
    trial = gateway.ask_new()
    original = moves.upsert  # (a tell's records go in the write that ends the trial)

    def refuse_long(backend, session, model, trial_id, attrs):
        if "saturn:huge" in attrs:
            raise _internal_error(sqlalchemy.exc.DataError("UPDATE", {}, Exception("Data too long for column")))
        return original(backend, session, model, trial_id, attrs)

    monkeypatch.setattr(moves, "upsert", refuse_long)
    started = time.monotonic()
    frozen = gateway.tell(trial, TrialState.COMPLETE, [1.0], attrs={"huge": "x"})
    assert time.monotonic() - started < 5.0
    assert frozen.state == TrialState.FAIL
    assert frozen.system_attrs["saturn:fail_reason"].startswith("could not record the result")


def test_the_heartbeat_never_waits_for_the_lock_to_list_its_trials(tmp_path):
    """The trials a gateway holds are read under a lock of their own (finding 4)."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    gateway = StudyGateway(study, owner={"sweep": "me"})
    trial = gateway.ask_new()
    listed = []
    with gateway.lock:
        reader = threading.Thread(target=lambda: listed.append(gateway.held_trials()))
        reader.start()
        reader.join(timeout=10)
    assert listed == [{trial.number: trial._trial_id}]


def test_the_outbox_clears_old_partial_files_and_sets_an_unreadable_one_aside(tmp_path, caplog):
    """A killed write left a ``.partial`` file for ever, and an unreadable file was warned about every 30 s
    (finding 20)."""
    import os

    outbox = Outbox(tmp_path / "outbox")
    outbox.folder.mkdir(mode=0o700)
    old, fresh = outbox.folder / "trial-1-aaaa.partial", outbox.folder / "trial-2-bbbb.partial"
    for partial in (old, fresh):
        partial.write_text("{")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    broken = outbox.folder / "trial-3-cccc.json"
    broken.write_text("{cut")
    with caplog.at_level("WARNING", logger="optuna.saturn"):
        assert outbox.pending() == [] and outbox.pending() == []
    assert not old.exists() and fresh.exists()
    assert not broken.exists() and (outbox.folder / "trial-3-cccc.json.unreadable").exists()
    assert caplog.text.count("is set aside") == 1


def test_a_run_whose_storage_stayed_down_past_the_retry_budget_runs_again(tmp_path, monkeypatch):
    """A worker's report waited out the whole retry budget (an outage over 2 minutes): the error reached the
    objective, and its trial ended FAIL as if its code had failed, never run again (the outage benchmark lost 1
    of 4 results to a 135 s outage). The storage's fault: the trial runs again."""
    from types import SimpleNamespace

    from optuna_saturn.clock import WallClock
    from optuna_saturn.pools.protocol import JobEnd
    from optuna_saturn.study import outbox
    from optuna_saturn.study.trial_session import TrialSession
    from optuna_saturn.sweep.faults import Faults

    monkeypatch.setattr(outbox, "RETRY_SECONDS", 0.3)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    gateway = StudyGateway(study)
    trial = gateway.ask_new()
    session = TrialSession(trial, gateway.lock, WallClock())

    def down(*args, **kwargs):
        raise sqlalchemy.exc.OperationalError("INSERT", {}, Exception("connection refused"))

    monkeypatch.setattr(study._storage, "set_trial_intermediate_value", down)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        session.handle("report", {"value": 1.0, "step": 1})
    assert session.storage_failed
    session.outcome = {"op": "fail", "error": "RemoteError: OperationalError"}  # (what the worker then says)
    run = SimpleNamespace(number=trial.number, stalled="", session=session, waiting=SimpleNamespace(retries=0))
    faults = Faults(stall_timeout=None, max_retries=1, may_leave_out=False)
    assert faults.run_again(run, JobEnd("trial-0", (0,), False, "rank 0 failed"))
