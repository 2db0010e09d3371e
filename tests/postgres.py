"""A PostgreSQL server of the test's own: initdb into a temporary folder, listening on 127.0.0.1 only, on a free
port, stopped by its data folder (pg_ctl, which signals the postmaster's PID). initdb refuses root, so the server
runs as the ``postgres`` user (``runuser``)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from support import require

_USER = "postgres"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self) -> None:
        for tool in ("initdb", "pg_ctl", "runuser"):
            require(shutil.which(tool) is not None, f"{tool} (PostgreSQL's server)",
                    fix="install PostgreSQL's server (apt-get install postgresql)")
        self.folder = tempfile.mkdtemp(prefix="saturn-postgres-")
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
        options = f"-k {self.folder} -h 127.0.0.1 -p {self.port} -c fsync=off"
        self._as_postgres(["pg_ctl", "-D", self.data, "-o", options, "-l", os.path.join(self.folder, "log"), "-w",
                           "start"])

    def stop(self) -> None:
        self._as_postgres(["pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"])

    def create_database(self, name: str) -> str:
        import psycopg2

        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user=_USER, dbname="postgres")
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        connection.close()
        return self.url(name)

    def remove(self) -> None:
        subprocess.run(["runuser", "-u", _USER, "--", "pg_ctl", "-D", self.data, "-m", "immediate", "stop"],
                       capture_output=True, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)

    @staticmethod
    def _as_postgres(command: list[str]) -> None:
        done = subprocess.run(["runuser", "-u", _USER, "--", *command], capture_output=True, text=True,
                              cwd="/", check=False)
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
