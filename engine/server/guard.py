"""The HTTP server's defences against hostile or broken clients, below the API (they act before any
authentication): which Host names are answered, how long a connection may take to send its request, how
many connections are kept, and a log that a flood of failures cannot fill.

- ``HostCheckMiddleware``: with the server bound to a loopback address, only requests whose Host header
  names this machine (localhost, 127.0.0.0/8, [::1]) or a name the user allowed are answered; anything else
  gets 400. A web page that rebinds its own domain to 127.0.0.1 (DNS rebinding) therefore cannot read the
  API from the user's browser, API key or not.
- ``guarded_protocol``: uvicorn's HTTP protocol with a deadline for each request's head (from the
  connection's start, or the end of the previous response, to the last header line: slowloris) and a cap on
  open connections: at the cap, the oldest connection that is not serving a request is closed to make room,
  or, when every connection is busy, the newcomer gets 503 and is closed. The cap stays below the process's
  file-descriptor limit, so accept() never fails for want of descriptors.
- ``FloodFilter`` on the loggers that a flood of bad connections writes to (asyncio, uvicorn, the server's
  own): at most ``burst`` records per ``interval`` seconds for one kind of message (logger + format
  string), the rest counted and reported once, as "[N similar messages suppressed]".
Request bodies read too slowly are the body-limit middleware's (engine.server.openai.app).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import resource
import time
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from engine.server.openai import errors

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
FD_RESERVE = 128  # descriptors kept for everything but HTTP connections (engine sockets, files, logs)


# ------------------------------------------------------------------------------------------------
# Host header


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# What a browser can send as Host (RFC 3986 reg-name / IPv4 / [IPv6], an optional numeric port): a value outside it
# ("localhost:18700@attacker.example", "localhost:abc", "") names no host of ours and is refused, not parsed leniently.
_HOST_VALUE = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9._~%!$&'()*+,;=-]+)(:[0-9]{1,5})?")


def host_of(header: str) -> str:
    """The name in a Host header, without the port, lower case: "[::1]:80" -> "::1"; "" for a value that is not
    a host and port at all (refused by every check)."""
    h = header.strip().lower()
    try:  # a bare IPv6 address ("::1", as a user may write it in --allowed-hosts)
        return str(ipaddress.ip_address(h))
    except ValueError:
        pass
    m = _HOST_VALUE.fullmatch(h)
    if m is None:
        return ""
    name = m.group(1)
    return (name[1:-1] if name.startswith("[") else name).rstrip(".")


class HostCheckMiddleware:
    """400 unless the Host header names this machine (a loopback name or address) or one of ``extra``
    ("*" allows any host; a leading "." allows a domain and its subdomains)."""

    def __init__(self, app: ASGIApp, extra: Iterable[str] = ()):
        self.app = app
        names = [n.strip().lower().rstrip(".") for n in extra if n and n.strip()]
        self.any = "*" in names
        self.names = {host_of(n) for n in names if not n.startswith(".") and n != "*"}
        self.suffixes = tuple(n for n in names if n.startswith("."))

    def allowed(self, host: str) -> bool:
        if self.any or is_loopback(host) or host in self.names:
            return True
        return bool(self.suffixes) and (host.endswith(self.suffixes) or "." + host in self.suffixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            header = next((v for k, v in scope["headers"] if k == b"host"), None)
            if header is not None:  # HTTP/1.0 without Host: no browser sends that
                host = host_of(header.decode("latin-1"))
                if not self.allowed(host):
                    shown = host if len(host) <= 100 else host[:100] + "..."
                    resp = errors.error_response(
                        400, f"Host {shown!r} is not served: this server answers to localhost, 127.0.0.1 and "
                             "[::1] only (a guard against DNS rebinding). Add other names with --allowed-hosts.",
                        "invalid_request_error", None, "invalid_host", headers={"Connection": "close"})
                    await resp(scope, receive, send)
                    return
        await self.app(scope, receive, send)


# ------------------------------------------------------------------------------------------------
# connections


def _fd_budget() -> int | None:
    """File descriptors this process may open beyond FD_RESERVE (None: no limit)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ValueError, OSError):
        return None
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return None
    return max(soft - FD_RESERVE, 32)


def raise_fd_limit(target: int = 65536) -> int:
    """Raise this process's soft limit of open files towards ``target`` (at most the hard limit), as vLLM
    does for its server; returns the soft limit in force."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = target if hard == resource.RLIM_INFINITY else min(target, hard)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    except (ValueError, OSError):
        soft = -1
    return soft


@dataclass(frozen=True)
class ConnectionLimits:
    """The connection cap and the accept burst (uvicorn's ``backlog``: asyncio accepts up to that many
    connections in one go, before any can be closed) share the descriptors left beside FD_RESERVE, three
    quarters and one quarter, so that accept() never fails for want of a descriptor."""

    header_timeout: float = 15.0  # seconds for a request's head, from connect / the previous response's end
    max_connections: int = 1024  # open HTTP connections (capped below the file-descriptor limit)

    def effective_max_connections(self) -> int:
        budget = _fd_budget()
        return self.max_connections if budget is None else max(16, min(self.max_connections, budget * 3 // 4))

    def backlog(self) -> int:
        budget = _fd_budget()
        return 2048 if budget is None else max(8, min(2048, budget // 4))


_BUSY_BODY = (b'{"error": {"message": "Too many open connections: retry shortly.", "type": "service_unavailable", '
              b'"param": null, "code": null}}')
_BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
                  b"retry-after: 1\r\ncontent-length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY)


class _GuardMixin:
    """Mixed in before uvicorn's H11Protocol / HttpToolsProtocol (see guarded_protocol)."""

    limits: ConnectionLimits
    cap: int

    # uvicorn's protocols store the ASGI app as ``self.app`` and call it per request: this property hands
    # them a wrapper that notes when a request is being served
    @property
    def app(self):
        return self._kestrel_serve

    @app.setter
    def app(self, value) -> None:
        self._kestrel_app = value

    async def _kestrel_serve(self, scope, receive, send) -> None:
        self._kestrel_busy += 1
        self._kestrel_cancel_timer()
        try:
            await self._kestrel_app(scope, receive, send)
        finally:
            self._kestrel_busy -= 1

    def connection_made(self, transport) -> None:
        self._kestrel_busy = 0
        self._kestrel_timer = None
        self._kestrel_since = time.monotonic()
        super().connection_made(transport)
        self._kestrel_arm_timer()
        if len(self.connections) > self.cap:
            self._kestrel_make_room()

    def connection_lost(self, exc) -> None:
        self._kestrel_cancel_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._kestrel_since = time.monotonic()
            self._kestrel_arm_timer()  # the next request's head has the same deadline

    def _kestrel_arm_timer(self) -> None:
        self._kestrel_cancel_timer()
        self._kestrel_timer = self.loop.call_later(self.limits.header_timeout, self._kestrel_timeout)

    def _kestrel_cancel_timer(self) -> None:
        timer = getattr(self, "_kestrel_timer", None)
        if timer is not None:
            timer.cancel()
            self._kestrel_timer = None

    def _kestrel_timeout(self) -> None:
        self._kestrel_timer = None
        if self.transport.is_closing():
            return
        if self._kestrel_busy:  # a response still finishing: look again later
            self._kestrel_arm_timer()
            return
        self.transport.close()

    def _kestrel_make_room(self) -> None:
        idle = [c for c in self.connections if c is not self and not getattr(c, "_kestrel_busy", 1)
                and not c.transport.is_closing()]
        if idle:
            min(idle, key=lambda c: c._kestrel_since).transport.close()
            return
        self._kestrel_cancel_timer()
        self.transport.write(_BUSY_RESPONSE)
        self.transport.close()


_protocols: dict[tuple[type, ConnectionLimits], type] = {}


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (httptools when installed, else h11) with ``limits`` enforced; pass it
    as ``uvicorn.Config(http=...)``."""
    try:  # httptools is optional (uvicorn[standard]); uvicorn loads with the server, not this module
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    key = (base, limits)
    if key not in _protocols:
        _protocols[key] = type(f"Guarded{base.__name__}", (_GuardMixin, base),
                               {"limits": limits, "cap": limits.effective_max_connections()})
    return _protocols[key]


# ------------------------------------------------------------------------------------------------
# the log


class FloodFilter(logging.Filter):
    """At most ``burst`` records per ``interval`` seconds per kind (logger and format string); the others
    are dropped and counted, and the next record of that kind that passes says how many were."""

    MAX_KINDS = 1024

    def __init__(self, burst: int = 20, interval: float = 10.0):
        super().__init__()
        self.burst = burst
        self.interval = interval
        self._kinds: dict[tuple[str, str], list] = {}  # kind -> [window start, passed, dropped]
        self.dropped_total = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        key = (record.name, str(record.msg)[:200])
        state = self._kinds.get(key)
        if state is None:
            if len(self._kinds) >= self.MAX_KINDS:
                self._kinds.clear()
            state = self._kinds[key] = [now, 0, 0]
        if now - state[0] >= self.interval:
            state[0], state[1] = now, 0
        if state[1] >= self.burst:
            state[2] += 1
            self.dropped_total += 1
            return False
        state[1] += 1
        if state[2]:
            record.msg = f"{record.getMessage()} [{state[2]} similar messages suppressed]"
            record.args = ()
            state[2] = 0
        return True


FLOODED_LOGGERS = ("asyncio", "uvicorn", "uvicorn.error", "uvicorn.access", "engine.server.openai.app",
                   "engine.server.openai.errors", "engine.server.serve", "engine.frontend.client",
                   "engine.frontend.pending", "engine.frontend.supervisor")

_filter = FloodFilter()


def install_flood_filter(names: Iterable[str] = FLOODED_LOGGERS) -> FloodFilter:
    """Put the (one, shared) FloodFilter on these loggers; safe to call again."""
    for name in names:
        logger = logging.getLogger(name)
        if _filter not in logger.filters:
            logger.addFilter(_filter)
    return _filter
