"""The flags of `kestrel serve`, importable without the server's packages (the CLI builds every parser)."""

from __future__ import annotations

import argparse

DEFAULT_MAX_REQUEST_BYTES = 16 * 2**20


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="Address to bind (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the network)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None,
                   help="Require 'Authorization: Bearer KEY' on /v1 routes (default: $KESTREL_API_KEY)")
    p.add_argument("--allowed-origins", nargs="*", default=None, help="CORS origins allowed (default: none)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="Name(s) clients use for the model (default: --model, or the model file's name)")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                   help="Largest request body accepted (413 above)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
