"""The private channel between a trial's rank-0 worker and the executor (DESIGN decision 1).

Newline-delimited JSON over a Unix-domain socket in a 0700 temporary folder, or, when trials run on other machines
(the Ray runner), over TCP on the address the cluster reaches this machine at (``tcp://HOST:PORT``). Only rank 0
connects; it presents the trial's random 128-bit token, which is the authentication: a connection without a
registered token gets an authentication error and is closed before any request is served, so a message can never
land on another trial, and a peer that does not know a token can do nothing. Nor can it hold the executor's
threads or memory: a hello must arrive whole within a deadline, only so many connections may wait for theirs (in
all, and per peer address), lines are bounded, and a line that is not a JSON object ends the connection with an
error. The parent answers each request with the result of calling the real ``optuna.Trial``: the user's sampler
and pruner decide, in the process that owns them.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import shutil
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from typing import Any

_logger = logging.getLogger(__name__)

#: How long, and how many bytes, a new connection has to present its hello (one deadline for the whole of it).
_HELLO_SECONDS = 10.0
_HELLO_BYTES = 64 * 1024
#: Connections that have not presented a valid hello yet, at most: in all, and from one peer address.
_UNAUTHENTICATED = 64
_UNAUTHENTICATED_PER_PEER = 16
#: The longest line an authenticated peer may send (a trial's report, its attributes, a profile).
_LINE_BYTES = 16 * 1024 * 1024
#: How long a worker keeps connecting again while the executor answers that it is busy.
BUSY_RETRY_SECONDS = 120.0
#: A rejected connection is logged at most once in this many seconds (with how many were rejected meanwhile).
_REJECTION_LOG_SECONDS = 10.0

#: A request handler: (op, message) -> reply value. Raising sends the error back to the worker.
Handler = Callable[[str, dict], Any]


class ProtocolError(ValueError):
    """A peer broke the channel's protocol: a line too long or not a JSON object, or no hello in time."""


class ChannelBusy(ConnectionError):
    """The executor had too many connections waiting for their hello (a stranger may be holding them): the worker
    connects again, with back-off, for up to :data:`BUSY_RETRY_SECONDS`."""


class AuthenticationFailed(ConnectionError):
    """The executor refused the token a worker presented: it belongs to no trial of the sweep (any more)."""


class ChannelClosed(ConnectionError):
    """The executor closed the channel (the sweep was stopped)."""


class RemoteError(RuntimeError):
    """An error raised in the parent while serving a worker's request, re-raised in the worker."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(type_name, message)
        self.type_name = type_name
        self.message = message

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}"


_RELAYED_BUILTINS = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "KeyError": KeyError,
    "NotImplementedError": NotImplementedError,  # (report and should_prune in a multi-objective study)
}


def _plain(value: Any) -> Any:
    """NumPy scalars (a pruner's ``numpy.bool_``, a sampler's ``numpy.float64``) as plain JSON values."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} cannot be sent to a worker.")


class _NamedThreadsServer(socketserver.ThreadingUnixStreamServer):
    """Names the thread of each connection, so that the pool host knows it for one of the executor's own
    (:func:`optuna_saturn.pools.forked_host.why_not_fork`)."""

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name="saturn-channel-connection",
            daemon=True,
        )
        thread.start()


class _NamedThreadsTCPServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    request_queue_size = 128  # (a flood of strangers' connections must not crowd out the workers')
    process_request = _NamedThreadsServer.process_request


class ChannelServer:
    """Serves every running trial of one sweep; each trial registers a handler under a fresh token.

    ``host`` None: a Unix socket, for workers on this machine. Otherwise a TCP socket bound to ``host`` (the IP
    the other nodes reach this one at; never a wildcard), on a port the system picks."""

    def __init__(self, *, host: str | None = None) -> None:
        from optuna_saturn.temp_folders import make_sweep_folder, remove_dead_sweeps_folders  # (the server's side)

        remove_dead_sweeps_folders()  # (executors killed before they could remove theirs)
        self._folder = make_sweep_folder()
        self._handlers: dict[str, tuple[str, Handler]] = {}  # a token's id -> its secret, and its handler
        self._lock = threading.Lock()
        self._waiting_total = 0  # connections without a hello yet, in all and per peer
        self._waiting: dict[str, int] = {}
        self._rejections = 0  # since the last warning
        self._next_rejection_log = 0.0
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
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="saturn-channel", daemon=True
        )
        self._thread.start()

    @property
    def folder(self) -> str:
        """The sweep's private 0700 folder on this machine (rendezvous files, error files, the pickled objective)."""
        return self._folder

    def register(self, handler: Handler) -> str:
        """A fresh token for ``handler``: ``<id>.<secret>``. The id finds the handler; the secret, 128 random
        bits, is compared in constant time (a dictionary lookup of the whole token would leak its prefix's
        timing)."""
        token_id, secret = secrets.token_hex(8), secrets.token_hex(16)
        with self._lock:
            self._handlers[token_id] = (secret, handler)
        return f"{token_id}.{secret}"

    def unregister(self, token: str) -> None:
        with self._lock:
            self._handlers.pop(token.partition(".")[0], None)

    def _handler_of(self, token: str) -> Handler | None:
        """(Under the lock.) The handler ``token`` names, if its secret is right."""
        token_id, _, secret = token.partition(".")
        found = self._handlers.get(token_id)
        if found is None or not hmac.compare_digest(found[0].encode(), secret.encode()):
            return None
        return found[1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> ChannelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve_connection(self, rfile: Any, wfile: Any, connection: socket.socket) -> None:
        served: list[Handler] = []  # the connection's handler, once its hello named a valid token
        hello: dict = {}  # what the peer said in its hello: the handler hears it again when the connection closes
        peer = _peer(connection)
        if not self._admit(peer):
            self._rejected(f"too many connections without a hello (from {peer})")
            _reply_error(wfile, ChannelBusy("too many connections are waiting to say hello; try again"))
            return
        try:
            self._serve_requests(_Lines(connection), wfile, served, hello, peer)
        except OSError:  # the peer vanished mid-request (a killed worker)
            pass
        except ProtocolError as exc:  # not our protocol, or too slow to say its hello
            self._rejected(f"{exc} (from {peer})")
            _reply_error(wfile, exc)
        finally:
            if not served:
                self._leave(peer)
            for handler in served:  # the peer went away (or exited): its handler hears it once, with its hello
                try:
                    handler("closed", {k: v for k, v in hello.items() if k not in ("op", "token")})
                except Exception:
                    _logger.exception("A channel handler failed on a closed connection.")

    def _serve_requests(self, lines: _Lines, wfile: Any, served: list[Handler], hello_said: dict, peer: str) -> None:
        # before its hello, a peer gets a few seconds in all and one line of bounded length, and only so many
        # peers may wait at once: a stranger that connects (over TCP, anyone who reaches the port) can hold
        # neither threads nor memory
        hello = lines.next(limit=_HELLO_BYTES, deadline=time.monotonic() + _HELLO_SECONDS)
        message = _message(hello) if hello else None
        with self._lock:
            handler = (
                self._handler_of(str(message.get("token", "")))
                if message is not None and message.get("op") == "hello"
                else None
            )
        if handler is None:
            if message is not None:
                self._rejected(f"a hello without a valid trial token (from {peer})")
                _reply_error(
                    wfile,
                    AuthenticationFailed(
                        "the executor knows no trial of this token (it ended, or this worker belongs to another sweep)"
                    ),
                )
            return
        served.append(handler)
        self._leave(peer)
        assert message is not None  # (a handler is found only for a hello)
        hello_said.update(message)
        while message is not None:
            try:
                line = json.dumps({"ok": True, "value": handler(str(message.get("op", "")), message)}, default=_plain)
            except Exception as exc:  # the worker re-raises it; the parent must keep serving
                line = json.dumps({"ok": False, "type": type(exc).__name__, "error": str(exc)})
            wfile.write((line + "\n").encode())
            wfile.flush()
            following = lines.next(limit=_LINE_BYTES)
            message = _message(following) if following else None

    def _admit(self, peer: str) -> bool:
        with self._lock:
            if self._waiting_total >= _UNAUTHENTICATED or self._waiting.get(peer, 0) >= _UNAUTHENTICATED_PER_PEER:
                return False
            self._waiting_total += 1
            self._waiting[peer] = self._waiting.get(peer, 0) + 1
            return True

    def _leave(self, peer: str) -> None:
        with self._lock:
            self._waiting_total -= 1
            self._waiting[peer] -= 1
            if not self._waiting[peer]:
                del self._waiting[peer]

    def _rejected(self, why: str) -> None:
        """Log a rejected connection, at most once per :data:`_REJECTION_LOG_SECONDS`."""
        with self._lock:
            self._rejections += 1
            now = time.monotonic()
            if now < self._next_rejection_log:
                return
            count, self._rejections = self._rejections, 0
            self._next_rejection_log = now + _REJECTION_LOG_SECONDS
        more = f" ({count - 1} more rejected since the last warning)" if count > 1 else ""
        _logger.warning(f"Closed a channel connection: {why}{more}.")


class _Lines:
    """A socket's lines, each of bounded length, the first by a deadline."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self._buffer = b""

    def next(self, *, limit: int, deadline: float | None = None) -> bytes:
        """The next line (b"" when the peer closed); :class:`ProtocolError` if it is longer than ``limit`` or
        not complete by ``deadline``."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > limit:
                raise ProtocolError(f"a line longer than {limit} bytes")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProtocolError("no hello in time")
                self._connection.settimeout(left)
            try:
                chunk = self._connection.recv(65536)
            except TimeoutError:
                raise ProtocolError("no hello in time") from None
            finally:
                self._connection.settimeout(None)
            if not chunk:
                return b""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        if len(line) > limit:
            raise ProtocolError(f"a line longer than {limit} bytes")
        return line


def _message(line: bytes) -> dict:
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        raise ProtocolError("a line that is not JSON") from None
    if not isinstance(message, dict):
        raise ProtocolError("a line that is not a JSON object")
    return message


def _reply_error(wfile: Any, error: Exception) -> None:
    try:
        wfile.write((json.dumps({"ok": False, "type": type(error).__name__, "error": str(error)}) + "\n").encode())
        wfile.flush()
    except OSError:
        pass


def _peer(connection: socket.socket) -> str:
    try:
        address = connection.getpeername()
    except OSError:
        return "?"
    return address[0] if isinstance(address, tuple) else "this machine"


class ChannelClient:
    """A worker's end of the channel (a trial's rank 0, or a warm worker asking for jobs). Calls are synchronous
    and serialised by a lock."""

    def __init__(self, address: str, token: str, *, hello: dict | None = None) -> None:
        self._lock = threading.Lock()
        deadline, wait = time.monotonic() + BUSY_RETRY_SECONDS, 0.1
        while True:
            self._connect(address)
            try:
                self.call("hello", token=token, pid=os.getpid(), **(hello or {}))
                return
            except ChannelBusy:
                self.close()
                if time.monotonic() + wait > deadline:
                    raise
                time.sleep(wait)
                wait = min(2 * wait, 5.0)

    def _connect(self, address: str) -> None:
        if address.startswith("tcp://"):
            host, port = address[len("tcp://") :].rsplit(":", 1)
            self._socket = socket.create_connection((host, int(port)))
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._socket.connect(address)
        self._file = self._socket.makefile("rwb")

    def call(self, op: str, **fields: Any) -> Any:
        with self._lock:
            self._file.write((json.dumps({"op": op, **fields}) + "\n").encode())
            self._file.flush()
            line = self._file.readline()
        if not line:
            raise ChannelClosed("The optuna-saturn executor closed the channel (the sweep was stopped).")
        reply = json.loads(line)
        if not reply["ok"]:
            if reply["type"] == AuthenticationFailed.__name__:
                raise AuthenticationFailed(f"The optuna-saturn executor refused this worker: {reply['error']}.")
            if reply["type"] == ChannelBusy.__name__:
                raise ChannelBusy(reply["error"])
            builtin = _RELAYED_BUILTINS.get(reply["type"])
            raise builtin(reply["error"]) if builtin else RemoteError(reply["type"], reply["error"])
        return reply["value"]

    def close(self) -> None:
        self._file.close()
        self._socket.close()
