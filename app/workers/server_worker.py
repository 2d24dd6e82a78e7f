"""The OpenAI-compatible endpoint: uvicorn serving engine.server's FastAPI app around the engine worker's own
EngineClient, on the engine worker's event loop (the client belongs to that loop). Starting and stopping
never block the GUI; every request served is reported (app.server_log) as a queued signal.

The endpoint follows the loaded model: when another model is loaded (or the same one with other settings)
it keeps its socket, its address and its options; meanwhile every request gets 503 with Retry-After (the
official clients retry), then the API is rebuilt around the new model's client (``modelChanged`` and
``started`` again). A load that fails in the engine brings the model before back (EngineWorker's revert): the
endpoint serves it again. One that is cancelled, or whose model before fails too, leaves no model to serve: the
endpoint stops, saying so.
Unloading the model stops it too."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.server_log import RequestLogMiddleware, TrackingClient
from app.workers.engine_worker import EngineWorker

log = logging.getLogger(__name__)


@dataclass
class ServerOptions:
    port: int = 8000
    api_key: str | None = None
    lan: bool = False  # listen on every interface instead of 127.0.0.1
    cors_origins: list[str] = field(default_factory=list)
    allowed_hosts: list[str] = field(default_factory=list)  # Host names answered besides loopback ones

    @property
    def host(self) -> str:
        return "0.0.0.0" if self.lan else "127.0.0.1"


class ServerWorker(QObject):
    started = Signal(str, str)  # base URL (without /v1), served model name (again after a model change)
    stopped = Signal(str)  # why, in words ("" when asked to)
    failed = Signal(str)
    requestLogged = Signal(object)  # app.server_log.LogEntry
    modelChanging = Signal(str)  # another model is being loaded: the notice (the endpoint answers 503 meanwhile)
    modelChanged = Signal(str, str)  # the endpoint serves another model now: the old name, the new one

    def __init__(self, engine: EngineWorker):
        super().__init__()
        self.engine = engine
        self.moveToThread(engine.thread())
        self._server = None
        self._task: asyncio.Task | None = None
        self._tracking: TrackingClient | None = None
        self._switch: _Switch | None = None
        self._opts: ServerOptions | None = None
        self.url: str | None = None  # while running
        self.model_name: str | None = None  # the model served (while running)
        engine.add_unload_hook(self._stop_for_unload)
        engine.add_model_listener(self._on_replacing, self._on_model_loaded)

    # GUI side
    def start(self, options: ServerOptions) -> None:
        self.engine.submit(self._start(options))

    def stop(self) -> None:
        self.engine.submit(self._stop(""))

    @property
    def running(self) -> bool:
        return self.url is not None

    # loop side
    async def _start(self, opts: ServerOptions) -> None:
        client = self.engine.client
        if client is None:
            self.failed.emit("Load a model first: the endpoint serves the loaded model.")
            return
        await self._stop(None)
        try:
            import uvicorn

            from engine.server.guard import ConnectionLimits, guarded_protocol, install_flood_filter
            from engine.server.openai.app import build_app  # noqa: F401 - its packages are there
        except ImportError as e:
            self.failed.emit(f"The server's packages are missing ({e.name}); install Kestrel's 'server' extra.")
            return
        name = client.info.name
        app, tracking = _api(client, opts)
        switch = _Switch(app)
        limits = ConnectionLimits()  # header deadline, connection cap (engine.server.guard)
        try:
            sock = _listen(opts.host, opts.port, limits.backlog())
        except OSError as e:
            tracking.close()
            self.failed.emit(_bind_error(e, opts))
            return
        config = uvicorn.Config(RequestLogMiddleware(switch, self.requestLogged.emit), log_level="warning",
                                access_log=False, lifespan="off", timeout_graceful_shutdown=3, timeout_keep_alive=15,
                                http=guarded_protocol(limits), backlog=limits.backlog())
        install_flood_filter()
        server = _quiet_server(config)
        # the socket is ours: uvicorn would call sys.exit() on a bind error, which would stop this event loop
        task = asyncio.ensure_future(_serve(server, sock))
        while not server.started:
            if task.done():
                tracking.close()
                sock.close()
                self.failed.emit(f"The server could not start: {_task_error(task)}")
                return
            await asyncio.sleep(0.02)
        port = sock.getsockname()[1]
        self._server, self._task, self._tracking, self._switch = server, task, tracking, switch
        self._opts, self.model_name = opts, name
        shown_host = "127.0.0.1" if not opts.lan else _lan_address()
        self.url = f"http://{shown_host}:{port}"
        task.add_done_callback(self._on_server_exit)
        self.started.emit(self.url, name)

    async def _stop(self, reason: str | None) -> None:
        server, task, tracking = self._server, self._task, self._tracking
        self._server = self._task = self._tracking = self._switch = None
        self.url = self.model_name = None
        if server is None:
            return
        if tracking is not None:
            tracking.close()
        server.should_exit = True
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, 10)
        if reason is not None:
            self.stopped.emit(reason)

    async def _stop_for_unload(self) -> None:
        await self._stop("Stopped: the model was unloaded.")

    async def _on_replacing(self, config) -> None:
        """Another model is about to replace the served one: answer 503 (retry) until it is loaded."""
        if self._switch is None:
            return
        self._switch.pause(self._opts)
        if self._tracking is not None:
            self._tracking.close()
            self._tracking = None
        model = str(getattr(config, "model", "") or "")
        shown = Path(model).name if model else "another model"
        self.modelChanging.emit(f"Loading {shown}: the endpoint keeps its address and answers 503 (retry) "
                                "until it is loaded.")

    async def _on_model_loaded(self, client, why: str) -> None:
        """The load that replaced the served model ended: serve the new model, or stop when there is none."""
        switch = self._switch
        if switch is None or not switch.paused:
            return
        if client is None:
            await self._stop(f"Stopped: {why}, so there is no model to serve.")
            return
        try:
            app, tracking = _api(client, self._opts)
        except Exception as e:  # noqa: BLE001 - said in the panel; the endpoint cannot serve this model
            log.exception("the API could not be rebuilt around the new model")
            await self._stop(f"Stopped: the endpoint could not serve the new model ({type(e).__name__}: {e}).")
            return
        old, self.model_name = self.model_name, client.info.name
        self._tracking = tracking
        switch.resume(app)
        self.modelChanged.emit(old or "", self.model_name)
        self.started.emit(self.url, self.model_name)

    def _on_server_exit(self, task: asyncio.Task) -> None:
        if self._task is task:  # it ended without being asked to
            if self._tracking is not None:
                self._tracking.close()
            self._server = self._task = self._tracking = self._switch = None
            self.url = self.model_name = None
            self.stopped.emit("The server stopped unexpectedly.")


def _api(client, opts: ServerOptions):
    """The OpenAI API around ``client`` (wrapped to count each HTTP request's tokens for the log)."""
    from engine.server.openai.app import build_app

    name = client.info.name
    tracking = TrackingClient(client)
    # on 127.0.0.1 only loopback Host names (and the user's) are answered: DNS rebinding gets 400
    app = build_app(tracking, served_model_names=[name], api_key=opts.api_key or None,
                    allowed_origins=opts.cors_origins or None,
                    allowed_hosts=_allowed_hosts(opts))
    return app, tracking


def _allowed_hosts(opts: ServerOptions) -> list[str] | None:
    return None if opts.lan and not opts.allowed_hosts else list(opts.allowed_hosts)


PAUSED_MESSAGE = "Kestrel is loading a model; retry in a few seconds."


class _Switch:
    """The ASGI app the server runs: the API of the model served, or, while another model loads, an answer
    of 503 with Retry-After to every request (behind the same Host check and API key as the API)."""

    def __init__(self, app):
        self.app = app
        self.paused = False

    def pause(self, opts: ServerOptions) -> None:
        from engine.server.guard import HostCheckMiddleware
        from engine.server.openai.app import APIKeyMiddleware

        app = _loading
        if opts.api_key:
            app = APIKeyMiddleware(app, opts.api_key)
        hosts = _allowed_hosts(opts)
        if hosts is not None:
            app = HostCheckMiddleware(app, extra=hosts)
        self.app, self.paused = app, True

    def resume(self, app) -> None:
        self.app, self.paused = app, False

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)


async def _loading(scope, receive, send) -> None:
    from engine.server.openai import errors

    if scope["type"] != "http":
        return
    headers = {"Retry-After": "2"}
    if scope.get("path") == "/health":
        from starlette.responses import Response

        body = json.dumps({"status": "loading", "reason": PAUSED_MESSAGE, "restarts": 0})
        resp = Response(body, 503, headers=headers, media_type="application/json")
    else:
        resp = errors.error_response(503, PAUSED_MESSAGE, "service_unavailable", None, "model_loading",
                                     headers=headers)
    await resp(scope, receive, send)


def _quiet_server(config):
    """A uvicorn.Server without signal handling (the app decides when it stops)."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return QuietServer(config)


async def _serve(server, sock) -> None:
    try:
        await server.serve(sockets=[sock])
    except SystemExit as e:  # never let uvicorn's exit stop the engine's event loop
        raise RuntimeError(f"the HTTP server exited (code {e.code})") from None


def _listen(host: str, port: int, backlog: int = 128):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _bind_error(e: OSError, opts: ServerOptions) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"Port {opts.port} is already in use (by another program?). Choose another port."
    if e.errno == errno.EACCES:
        return f"Port {opts.port} needs administrator rights. Choose a port above 1024."
    return f"The server cannot listen on {opts.host}:{opts.port}: {e.strerror or e}."


def _task_error(task: asyncio.Task) -> str:
    try:
        task.result()
    except BaseException as e:  # noqa: BLE001 - SystemExit included
        return str(e) or type(e).__name__
    return "it stopped while starting"


def _lan_address() -> str:
    """This machine's address on the local network (for the URL shown when LAN access is on)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent; this picks the outgoing interface
        return s.getsockname()[0]
    return socket.gethostname()
