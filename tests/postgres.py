"""PostgreSQL for the tests.

- :func:`postgres_server`: a server of the test's own (a test that stops and starts it): initdb into a temporary
  folder, listening on 127.0.0.1 only, on a free port, stopped by its data folder (pg_ctl, which signals the
  postmaster's PID). initdb refuses root, so the server runs as the ``postgres`` user (``runuser``).
  ``python tests/postgres.py start FOLDER`` starts one the same way and prints its port (``.ci/run`` does, for
  the whole test run); ``stop FOLDER`` stops it.
- :func:`postgres_database`: a fresh database, dropped afterwards, on the server ``.ci/run`` started
  (``SATURN_TEST_POSTGRES=127.0.0.1:PORT``), or on a server of its own where none was.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from support import require

_USER = "postgres"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


class PostgresServer:
    def __init__(self, folder: str | None = None) -> None:
        for tool in ("initdb", "pg_ctl", "runuser"):
            require(
                shutil.which(tool) is not None,
                f"{tool} (PostgreSQL's server)",
                fix="install PostgreSQL's server (apt-get install postgresql)",
            )
        self.folder = folder or tempfile.mkdtemp(prefix="saturn-postgres-")
        os.makedirs(self.folder, exist_ok=True)
        shutil.chown(self.folder, _USER)
        os.chmod(self.folder, 0o700)
        self.port = _free_port()
        self._as_postgres(["initdb", "-D", self.data, "-A", "trust", "-U", _USER, "--no-sync"])

    @property
    def data(self) -> str:
        return os.path.join(self.folder, "data")

    def url(self, database: str) -> str:
        return f"postgresql+psycopg2://{_USER}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        """Start the server; a port another process took since it was chosen (they are chosen free, then used)
        is given up for another, a few times."""
        for attempt in range(5):
            options = f"-k {self.folder} -h 127.0.0.1 -p {self.port} -c fsync=off"
            try:
                self._as_postgres(
                    ["pg_ctl", "-D", self.data, "-o", options, "-l", os.path.join(self.folder, "log"), "-w", "start"]
                )
                return
            except RuntimeError:
                if attempt == 4 or not _taken(self.port):
                    raise
                self.port = _free_port()

    def stop(self) -> None:
        self._as_postgres(["pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"])

    def create_database(self, name: str) -> str:
        _administer(self.port, f"CREATE DATABASE {name}")
        return self.url(name)

    def remove(self) -> None:
        subprocess.run(
            ["runuser", "-u", _USER, "--", "pg_ctl", "-D", self.data, "-m", "immediate", "stop"],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(self.folder, ignore_errors=True)

    @staticmethod
    def _as_postgres(command: list[str]) -> None:
        done = subprocess.run(
            ["runuser", "-u", _USER, "--", *command], capture_output=True, text=True, cwd="/", check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.remove()


def _administer(port: int, statement: str) -> None:
    import psycopg2

    connection = psycopg2.connect(host="127.0.0.1", port=port, user=_USER, dbname="postgres")
    connection.autocommit = True
    with connection.cursor() as cursor:
        cursor.execute(statement)
    connection.close()


@contextmanager
def postgres_database() -> Iterator[str]:
    """The URL of a fresh database, dropped afterwards (see the module's docstring)."""
    name = "saturn_" + uuid.uuid4().hex[:12]
    shared = os.environ.get("SATURN_TEST_POSTGRES")
    if not shared:
        with postgres_server() as server:
            yield server.create_database(name)
        return
    port = int(shared.rsplit(":", 1)[1])
    _administer(port, f"CREATE DATABASE {name}")
    try:
        yield f"postgresql+psycopg2://{_USER}@127.0.0.1:{port}/{name}"
    finally:
        _administer(port, f"DROP DATABASE {name} WITH (FORCE)")


if __name__ == "__main__":  # .ci/run: one server for the whole test run
    import sys

    action, folder = sys.argv[1], sys.argv[2]
    if action == "start":
        server = PostgresServer(folder)
        server.start()
        print(server.port)
    else:
        PostgresServer._as_postgres(["pg_ctl", "-D", os.path.join(folder, "data"), "-m", "fast", "-w", "stop"])
