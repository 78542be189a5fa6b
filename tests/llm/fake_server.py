"""A small LLM server on loopback that speaks both wire formats, for tests that drive the real
SDK clients without the network.

- Anthropic: ``POST /v1/messages`` (the SDK's base URL is the server root);
- OpenAI: ``POST /v1/chat/completions`` (the SDK's base URL is ``<root>/v1``).

Each request takes the next scripted action (:class:`Reply`, :class:`Fail`, :class:`Stall`,
:class:`Garbage`), or the ``default`` action once the script is used up. Every request is
recorded (path, headers, JSON body, arrival time) so tests can count retries and read what
was sent.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANTHROPIC_PATH = "/v1/messages"
OPENAI_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Reply:
    """A successful answer carrying ``text``."""

    text: str
    input_tokens: int = 120
    output_tokens: int = 40
    finish_reason: str | None = None  # None: end_turn / stop, per wire format
    model: str | None = None  # None: echo the requested model


@dataclass(frozen=True)
class Fail:
    """An HTTP error. ``echo_key`` puts the key the client sent into the error message, like a
    careless server would."""

    status: int
    message: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)
    echo_key: bool = False


@dataclass(frozen=True)
class Stall:
    """Wait ``seconds`` before answering with ``then`` (long enough to trip a client timeout)."""

    seconds: float
    then: Reply = Reply("late answer")


@dataclass(frozen=True)
class Garbage:
    """A 200 whose body is not the wire format."""

    body: bytes = b'{"unexpected": true}'


Action = Reply | Fail | Stall | Garbage


@dataclass(frozen=True)
class Seen:
    """One request the server received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float

    @property
    def wire(self) -> str:
        return "anthropic" if self.path == ANTHROPIC_PATH else "openai"


def _anthropic_body(action: Reply, request: dict[str, Any], n: int) -> dict[str, Any]:
    return {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": action.model or request.get("model", "unknown"),
        "content": [{"type": "text", "text": action.text}],
        "stop_reason": action.finish_reason or "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": action.input_tokens, "output_tokens": action.output_tokens},
    }


def _openai_body(action: Reply, request: dict[str, Any], n: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": action.model or request.get("model", "unknown"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": action.text},
                "finish_reason": action.finish_reason or "stop",
            }
        ],
        "usage": {
            "prompt_tokens": action.input_tokens,
            "completion_tokens": action.output_tokens,
            "total_tokens": action.input_tokens + action.output_tokens,
        },
    }


def _client_gone(h: BaseHTTPRequestHandler) -> bool:
    """True once the client closed the connection while waiting for the answer (a client
    that times out does so; one waiting for an answer sends nothing more)."""
    readable, _, _ = select.select([h.connection], [], [], 0)
    if not readable:
        return False
    try:
        return h.connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _error_body(wire: str, status: int, message: str) -> dict[str, Any]:
    if wire == "anthropic":
        kind = {429: "rate_limit_error", 401: "authentication_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": "fake_error", "code": str(status)}}


class FakeLLMServer:
    """Start with :meth:`start` (or as a context manager); ``url`` is the server root."""

    def __init__(self) -> None:
        self.script: deque[Action] = deque()
        self.default: Action | None = None
        self.requests: list[Seen] = []
        self.abandoned = 0
        """Stalled requests whose client closed the connection before the answer (gave up)."""
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control

    def play(self, *actions: Action, default: Action | None = None) -> FakeLLMServer:
        """Script the next answers (and what to do after them)."""
        with self._lock:
            self.script.extend(actions)
            self.default = default
        return self

    @property
    def url(self) -> str:
        assert self._httpd is not None, "the fake server is not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def base_url(self, wire: str) -> str:
        """What to give the SDK as base_url for ``wire`` (anthropic or openai)."""
        return self.url if wire == "anthropic" else f"{self.url}/v1"

    def abandoned_requests(self, expected: int, wait_s: float = 60.0) -> int:
        """How many stalled requests their client hung up on, once `expected` are (the
        server notices a closed connection within a poll, after the client moved on), or
        when `wait_s` has passed."""
        deadline = time.monotonic() + wait_s
        while self.abandoned < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.abandoned

    def count(self, path: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests if path is None or r.path == path)

    def start(self) -> FakeLLMServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                server._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ serving

    def _next(self) -> Action | None:
        with self._lock:
            return self.script.popleft() if self.script else self.default

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        seen = Seen(h.path, {k.lower(): v for k, v in h.headers.items()}, body, time.monotonic())
        with self._lock:
            self.requests.append(seen)
            n = len(self.requests)
        if h.path not in (ANTHROPIC_PATH, OPENAI_PATH):
            self._send(h, 404, {"error": {"message": f"no route {h.path}"}})
            return
        action = self._next()
        if action is None:
            self._send(h, 500, _error_body(seen.wire, 500, "fake server: nothing scripted"))
            return
        if isinstance(action, Stall):
            deadline = time.monotonic() + action.seconds
            while time.monotonic() < deadline and not self._stopping.is_set():
                if _client_gone(h):
                    with self._lock:
                        self.abandoned += 1
                    return
                time.sleep(0.01)
            action = action.then
        if isinstance(action, Garbage):
            self._send(h, 200, action.body)
        elif isinstance(action, Fail):
            message = action.message
            if action.echo_key:
                sent = seen.headers.get("x-api-key") or seen.headers.get("authorization", "")
                message = f"{message}: invalid key {sent}"
            self._send(
                h, action.status, _error_body(seen.wire, action.status, message), action.headers
            )
        else:
            make = _anthropic_body if seen.wire == "anthropic" else _openai_body
            self._send(h, 200, make(action, body, n))

    @staticmethod
    def _send(
        h: BaseHTTPRequestHandler,
        status: int,
        payload: dict[str, Any] | bytes,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        try:
            h.send_response(status)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(data)))
            h.send_header("request-id", "req_fake")
            for name, value in (headers or {}).items():
                h.send_header(name, value)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)
