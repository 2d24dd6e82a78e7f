"""Running the OpenAI-compatible server: ``kestrel serve`` (``main``), ``start_server`` (on the running
loop, around an EngineClient you already have, e.g. the GUI's) and ``BackgroundServer`` (its own thread and
loop, for tests and tools)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from dataclasses import dataclass

import uvicorn

from engine import envs
from engine.frontend.client import EngineClient, RestartPolicy
from engine.config import EngineConfig
from engine.errors import KestrelError
from engine.server.args import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_REQUEST_BYTES,
)
from engine.server.guard import (
    ConnectionLimits,
    guarded_protocol,
    install_flood_filter,
    is_loopback,
    raise_fd_limit,
)
from engine.server.openai.app import build_app
from engine.server.openai.serving_chat import read_chat_template

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn's server without its own signal handling: whoever runs it decides when it stops."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


@dataclass
class RunningServer:
    server: uvicorn.Server
    task: asyncio.Task
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def start_server(client: EngineClient, host: str = "127.0.0.1", port: int = 8000, *,
                       served_model_names: list[str] | None = None, api_key: str | None = None,
                       allowed_origins: list[str] | None = None, allowed_hosts: list[str] | None = None,
                       max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                       max_connections: int = DEFAULT_MAX_CONNECTIONS,
                       header_timeout: float = DEFAULT_HEADER_TIMEOUT_S, body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
                       timeout_keep_alive: float = DEFAULT_KEEP_ALIVE_S, log_level: str = "warning",
                       access_log: bool = False, chat_template: str | None = None,
                       tool_call_parser: str | None = None) -> RunningServer:
    """Serve ``client`` over HTTP on the running loop; returns once the socket listens (port 0: any free).
    Bound to a loopback address, only loopback Host names and ``allowed_hosts`` are answered (elsewhere
    the Host check applies only when ``allowed_hosts`` is given)."""
    app = build_app(client, served_model_names=served_model_names, api_key=api_key,
                    allowed_origins=allowed_origins, max_request_bytes=max_request_bytes,
                    allowed_hosts=host_check_for(host, allowed_hosts), body_timeout=body_timeout,
                    chat_template=chat_template, tool_call_parser=tool_call_parser)
    limits = ConnectionLimits(header_timeout=header_timeout, max_connections=max_connections)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                            lifespan="off", timeout_graceful_shutdown=3, timeout_keep_alive=timeout_keep_alive,
                            http=guarded_protocol(limits), backlog=limits.backlog())
    install_flood_filter()  # after uvicorn's logging set-up
    server = _Server(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()  # raises why it could not start (e.g. the port is taken)
            raise OSError(f"the server on {host}:{port} stopped while starting")
        await asyncio.sleep(0.02)
    sock = server.servers[0].sockets[0]
    return RunningServer(server, task, host, sock.getsockname()[1])


def host_check_for(host: str, allowed_hosts: list[str] | None) -> list[str] | None:
    """The extra Host names HostCheckMiddleware allows, or None for no check: bound to loopback, always
    checked; bound elsewhere, checked only when the user listed the names."""
    if allowed_hosts is not None:
        return list(allowed_hosts)
    return [] if is_loopback(host) else None


class BackgroundServer:
    """An engine and its server on a thread of their own: ``with BackgroundServer(config) as srv: srv.url``."""

    def __init__(self, config: EngineConfig | None = None, *, core_factory: str | None = None,
                 startup_timeout: float = 600, restart: RestartPolicy | None = None, **server_kwargs):
        self.config = config or EngineConfig()
        self.core_factory = core_factory
        self.restart = restart
        self.server_kwargs = {"port": 0, **server_kwargs}
        self.startup_timeout = startup_timeout
        self.loop: asyncio.AbstractEventLoop | None = None
        self.client: EngineClient | None = None
        self.running: RunningServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return self.running.url

    def start(self) -> BackgroundServer:
        self._thread = threading.Thread(target=self._run, name="kestrel-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.startup_timeout):
            raise TimeoutError("the server did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            self.client = await EngineClient.start(self.config, core_factory=self.core_factory, restart=self.restart)
            self.running = await start_server(self.client, **self.server_kwargs)
        except BaseException as e:
            self._error = e
            self._ready.set()
            if self.client is not None:
                await self.client.shutdown()
            return
        self._ready.set()
        await self._stop.wait()
        await self.running.stop()
        await self.client.shutdown()

    def call(self, coro, timeout: float | None = 60):
        """Run a coroutine on the server's loop (e.g. ``srv.call(srv.client.stats())``)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop is not None and self._thread is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(60)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------------
# kestrel serve


def _is_loopback(host: str) -> bool:
    return is_loopback(host)


def api_key_of(args) -> str | None:
    """--api-key, else the first line of --api-key-file, else $KESTREL_API_KEY."""
    if args.api_key:
        return args.api_key
    path = getattr(args, "api_key_file", None)
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                key = f.readline().strip()
        except OSError as e:
            raise KestrelError(f"The API key file {path} cannot be read: {e.strerror or e}.") from None
        if not key:
            raise KestrelError(f"The API key file {path} is empty.")
        return key
    return envs.KESTREL_API_KEY or None


def restart_policy_of(args) -> RestartPolicy | None:
    n = getattr(args, "max_engine_restarts", 0)
    return RestartPolicy(max_restarts=n) if n and n > 0 else None


async def _serve(args, config: EngineConfig) -> int:
    api_key = api_key_of(args)
    raise_fd_limit()
    if args.api_key:
        print("warning: an API key given with --api-key is visible to other users of this machine (ps). Use "
              "KESTREL_API_KEY or --api-key-file instead.", file=sys.stderr)
    if not _is_loopback(args.host) and not api_key:
        print(f"warning: serving on {args.host} without an API key: anyone who can reach this machine can use "
              "the model. Set KESTREL_API_KEY or --api-key-file.", file=sys.stderr)
    names = args.served_model_name or ([config.model] if config.model else None)

    def progress(stage: str, detail: str) -> None:
        print(f"{stage} {detail}...", file=sys.stderr, flush=True)

    client = await EngineClient.start(config, on_progress=progress, restart=restart_policy_of(args))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    dead = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    def on_state(state: str, detail: str) -> None:
        if state == "dead":
            dead.set()

    client.add_state_listener(on_state)
    try:
        running = await start_server(client, args.host, args.port, served_model_names=names, api_key=api_key,
                                     allowed_origins=args.allowed_origins, allowed_hosts=args.allowed_hosts,
                                     max_request_bytes=args.max_request_bytes, max_connections=args.max_connections,
                                     header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                                     timeout_keep_alive=args.timeout_keep_alive, log_level=args.log_level,
                                     access_log=args.log_level in ("debug", "info"),
                                     chat_template=read_chat_template(getattr(args, "chat_template", None)),
                                     tool_call_parser=getattr(args, "tool_call_parser", None))
    except BaseException:
        await client.shutdown()
        raise
    info = client.info
    print(f"Kestrel is serving {info.name} ({info.dtype}, {info.device}, context {info.max_model_len}) as "
          f"{', '.join(running.server.config.app.state.ctx.served_model_names)}", flush=True)
    print(f"OpenAI base URL: {running.url}/v1" + ("   (API key required)" if api_key else ""), flush=True)
    print("Press Ctrl-C to stop.", flush=True)
    stopper = asyncio.ensure_future(stop.wait())
    dier = asyncio.ensure_future(dead.wait())
    await asyncio.wait({running.task, stopper, dier}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if dead.is_set() and not stop.is_set():
        print(f"error: {client.dead_reason or 'the engine died'}\nKestrel exits (status 1) so that a service "
              "manager can start it again.", file=sys.stderr, flush=True)
        code = 1
    else:
        print("stopping...", file=sys.stderr, flush=True)
    stopper.cancel()
    dier.cancel()
    await running.stop()
    await client.shutdown()
    return code


def main(args) -> int:
    config = EngineConfig.from_cli_args(args)
    return asyncio.run(_serve(args, config))
