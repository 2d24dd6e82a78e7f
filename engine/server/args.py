"""The flags of `kestrel serve`, importable without the server's packages (the CLI builds every parser)."""

from __future__ import annotations

import argparse

DEFAULT_MAX_REQUEST_BYTES = 16 * 2**20
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_HEADER_TIMEOUT_S = 15.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_KEEP_ALIVE_S = 15.0
DEFAULT_ENGINE_RESTARTS = 5
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral")  # vLLM's names (engine.tokenizer.tool_parsers.FORMATS)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="Address to bind (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the network)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None,
                   help="Require 'Authorization: Bearer KEY' on /v1 routes, /tokenize, /detokenize and for the "
                        "full /metrics. A key given here is visible to every user of this machine (ps, "
                        "/proc): prefer the environment variable KESTREL_API_KEY or --api-key-file")
    p.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="Read the API key from the first line of this file (keep it readable by you only)")
    p.add_argument("--allowed-origins", nargs="*", default=None, help="CORS origins allowed (default: none)")
    p.add_argument("--allowed-hosts", nargs="*", default=None, metavar="HOST",
                   help="Host names answered besides localhost, 127.0.0.1 and [::1] (with a loopback --host, "
                        "requests naming any other host get 400: a guard against DNS rebinding); '.example.org' "
                        "allows a domain and its subdomains, '*' any host")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="Name(s) clients use for the model (default: --model, or the model file's name)")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                   help="Largest request body accepted (413 above)")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                   help="Most open HTTP connections (kept below the file-descriptor limit); at the limit the "
                        "oldest idle connection is closed, or the newcomer gets 503 when none is idle")
    p.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT_S, metavar="SECONDS",
                   help="Time a client has to send a request's headers (from connecting, or from the end of "
                        "the previous response) before the connection is closed")
    p.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT_S, metavar="SECONDS",
                   help="Longest pause while a request body is read (408 after it; the whole body may take at "
                        "most four times this)")
    p.add_argument("--timeout-keep-alive", type=float, default=DEFAULT_KEEP_ALIVE_S, metavar="SECONDS",
                   help="Close an idle keep-alive connection after this long")
    p.add_argument("--max-engine-restarts", type=int, default=DEFAULT_ENGINE_RESTARTS, metavar="N",
                   help="Restart the engine process if it dies, with the same model and options, at most N "
                        "times in 10 minutes (after 1 s, then 2, 4, ... up to 30 s); past that, or with 0, the "
                        "server exits with status 1 so that a service manager can restart it")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="A Jinja chat template file used instead of the model's (as vLLM's flag)")
    p.add_argument("--tool-call-parser", default=None, choices=TOOL_CALL_PARSERS,
                   help="The tool-call format of a chat template that takes tools (default: the one the template "
                        "teaches). A template that takes no tools gets Kestrel's built-in tool prompt and its "
                        "hermes format; GET /v1/server_info's 'tools' says which applies")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
