"""GET /v1/server_info carries auto's start-up all-reduce table (the engine's stats ``comm_table``) when the
tensor-parallel size is above 1, and `kestrel bench serve` records it in its report. The engine is the fake one
(tests/server/fake_engine.py) made to say it runs TP 2 with a measured table: a real TP engine's table is
tested where it is measured (tests/parallel)."""

from __future__ import annotations

import json

import httpx
import msgspec

from tests.server.conftest import make_server
from tests.server.fake_engine import FakeCore

TABLE = [{"bytes": 2048, "latency_us": {"host": 11.5, "nccl": 40.0}, "ok": {"host": True, "nccl": True},
          "max_err_ratio": {"host": 0.0, "nccl": 0.0}, "choice": "host"},
         {"bytes": 8 << 20, "latency_us": {"host": 900.0, "nccl": 650.0}, "ok": {"host": True, "nccl": True},
          "max_err_ratio": {"host": 0.0, "nccl": 0.0}, "choice": "nccl"}]


class TPFakeCore(FakeCore):
    """The fake engine with TP 2 and auto's table in its stats (as engine.wire.EngineStats has them)."""

    def stats(self, recent=32):
        return msgspec.structs.replace(super().stats(recent), tp_size=2, comm_strategy="auto", comm_table=TABLE)


def test_server_info_has_the_comm_table_at_tp_2_and_the_report_keeps_it(tmp_path):
    from engine.cli import main

    srv = make_server(core_factory="tests.server.test_bench_comm_table:TPFakeCore",
                      engine={"tensor_parallel_size": 2, "comm_strategy": "auto"})
    try:
        info = httpx.get(srv.url + "/v1/server_info").json()
        assert info["tensor_parallel_size"] == 2 and info["comm_strategy"] == "auto"
        assert info["comm_table"] == TABLE
        out = tmp_path / "tp.json"
        assert main(["bench", "serve", "--base-url", srv.url, "--num-prompts", "2", "--random-input-len", "5",
                     "--random-output-len", "2", "--num-warmups", "0", "--disable-tqdm",
                     "--result-filename", str(out)]) == 0
        assert json.loads(out.read_text())["server"]["kestrel"]["comm_table"] == TABLE
    finally:
        srv.stop()


def test_no_comm_table_at_tp_1():
    srv = make_server(core_factory="tests.server.test_bench_comm_table:TPFakeCore")
    try:
        info = httpx.get(srv.url + "/v1/server_info").json()
        assert info["tensor_parallel_size"] == 1 and info["comm_table"] is None and info["comm_strategy"] is None
    finally:
        srv.stop()
