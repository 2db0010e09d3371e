"""The private channel between a trial's rank-0 worker and the executor (DESIGN decision 1).

Newline-delimited JSON over a Unix-domain socket in a 0700 temporary folder, or, when trials run on other machines
(the Ray runner), over TCP on the address the cluster reaches this machine at (``tcp://HOST:PORT``). Only rank 0
connects; it presents the trial's random 128-bit token, which is the authentication: a connection without a
registered token is closed before any request is served, so a message can never land on another trial, and a
peer that does not know a token can do nothing. The parent answers each request with the
result of calling the real ``optuna.Trial``: the user's sampler and pruner decide, in the process that owns them.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import shutil
import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable
from typing import Any

_logger = logging.getLogger(__name__)

#: How long, and how many bytes, a new connection has to present its hello.
_HELLO_SECONDS = 10.0
_HELLO_BYTES = 64 * 1024

#: A request handler: (op, message) -> reply value. Raising sends the error back to the worker.
Handler = Callable[[str, dict], Any]


class RemoteError(RuntimeError):
    """An error raised in the parent while serving a worker's request, re-raised in the worker."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(type_name, message)
        self.type_name = type_name
        self.message = message

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}"


_RELAYED_BUILTINS = {"ValueError": ValueError, "TypeError": TypeError, "KeyError": KeyError}


def _plain(value: Any) -> Any:
    """NumPy scalars (a pruner's ``numpy.bool_``, a sampler's ``numpy.float64``) as plain JSON values."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} cannot be sent to a worker.")


class _NamedThreadsServer(socketserver.ThreadingUnixStreamServer):
    """Names the thread of each connection, so that the pool host knows it for one of the executor's own
    (:func:`optuna_saturn.pools.forked_host.why_not_fork`)."""

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                                  name="saturn-channel-connection", daemon=True)
        thread.start()


class _NamedThreadsTCPServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    process_request = _NamedThreadsServer.process_request


class ChannelServer:
    """Serves every running trial of one sweep; each trial registers a handler under a fresh token.

    ``host`` None: a Unix socket, for workers on this machine. Otherwise a TCP socket bound to ``host`` (the IP
    the other nodes reach this one at; never a wildcard), on a port the system picks."""

    def __init__(self, *, host: str | None = None) -> None:
        self._folder = tempfile.mkdtemp(prefix="optuna-saturn-")
        os.chmod(self._folder, 0o700)
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()
        server = self

        class _RequestHandler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                server._serve_connection(self.rfile, self.wfile, self.connection)

        if host is None:
            self.address = os.path.join(self._folder, "channel.sock")
            self._server: socketserver.BaseServer = _NamedThreadsServer(self.address, _RequestHandler)
        else:
            if host in ("", "0.0.0.0", "::"):
                raise ValueError("The channel binds one address the cluster reaches this machine at, not all.")
            self._server = _NamedThreadsTCPServer((host, 0), _RequestHandler)
            self.address = f"tcp://{host}:{self._server.server_address[1]}"
        self._server.daemon_threads = True
        # (close() waits for the serving loop's next poll: the default half second would end every sweep late)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="saturn-channel", daemon=True)
        self._thread.start()

    @property
    def folder(self) -> str:
        """The sweep's private 0700 folder on this machine (rendezvous files, error files, the pickled objective)."""
        return self._folder

    def register(self, handler: Handler) -> str:
        token = secrets.token_hex(16)
        with self._lock:
            self._handlers[token] = handler
        return token

    def unregister(self, token: str) -> None:
        with self._lock:
            self._handlers.pop(token, None)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> "ChannelServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve_connection(self, rfile: Any, wfile: Any, connection: socket.socket) -> None:
        served: list[Handler] = []  # the connection's handler, once its hello named a valid token
        hello: dict = {}  # what the peer said in its hello: the handler hears it again when the connection closes
        try:
            self._serve_requests(rfile, wfile, served, connection, hello)
        except OSError:  # the peer vanished mid-request (a killed worker), or said nothing in time
            pass
        except ValueError:  # not our protocol
            _logger.warning("Closed a channel connection that did not speak the channel's protocol.")
        finally:
            for handler in served:  # the peer went away (or exited): its handler hears it once, with its hello
                try:
                    handler("closed", {k: v for k, v in hello.items() if k not in ("op", "token")})
                except Exception:
                    _logger.exception("A channel handler failed on a closed connection.")

    def _serve_requests(
        self, rfile: Any, wfile: Any, served: list[Handler], connection: socket.socket, hello_said: dict
    ) -> None:
        # before its hello, a peer gets a few seconds and one line of bounded length: a stranger that connects
        # (over TCP, anyone who reaches the port) can hold neither a thread nor memory
        connection.settimeout(_HELLO_SECONDS)
        hello = rfile.readline(_HELLO_BYTES)
        connection.settimeout(None)
        for line in itertools.chain([hello] if hello else [], rfile):
            message = json.loads(line)
            op = message.get("op", "")
            if not served:
                with self._lock:
                    handler = self._handlers.get(message.get("token", "")) if op == "hello" else None
                if handler is None:
                    _logger.warning("Rejected a channel connection without a valid trial token.")
                    return
                served.append(handler)
                hello_said.update(message)
            try:
                line = json.dumps({"ok": True, "value": served[0](op, message)}, default=_plain)
            except Exception as exc:  # the worker re-raises it; the parent must keep serving
                line = json.dumps({"ok": False, "type": type(exc).__name__, "error": str(exc)})
            wfile.write((line + "\n").encode())
            wfile.flush()


class ChannelClient:
    """A worker's end of the channel (a trial's rank 0, or a warm worker asking for jobs). Calls are synchronous
    and serialised by a lock."""

    def __init__(self, address: str, token: str, *, hello: dict | None = None) -> None:
        if address.startswith("tcp://"):
            host, port = address[len("tcp://"):].rsplit(":", 1)
            self._socket = socket.create_connection((host, int(port)))
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._socket.connect(address)
        self._file = self._socket.makefile("rwb")
        self._lock = threading.Lock()
        self.call("hello", token=token, pid=os.getpid(), **(hello or {}))

    def call(self, op: str, **fields: Any) -> Any:
        with self._lock:
            self._file.write((json.dumps({"op": op, **fields}) + "\n").encode())
            self._file.flush()
            line = self._file.readline()
        if not line:
            raise ConnectionError("The optuna-saturn executor closed the channel (the sweep was stopped).")
        reply = json.loads(line)
        if not reply["ok"]:
            builtin = _RELAYED_BUILTINS.get(reply["type"])
            raise builtin(reply["error"]) if builtin else RemoteError(reply["type"], reply["error"])
        return reply["value"]

    def close(self) -> None:
        self._file.close()
        self._socket.close()
