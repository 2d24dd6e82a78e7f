"""Rank 0 -> workers messages through the group's shared segment (the per-step channel of StepInputs).

Rank 0 pickles the message into the mailbox area, stores its size, bumps the mailbox sequence number and
wakes sleepers (a futex on the sequence word, only when a worker sleeps). Workers wait on the sequence
number (spin ~50 us, then sleep in futex_wait in 1 ms slices; the sequence store wakes them), copy the bytes out and ack
with their own sequence word; rank 0 only waits for the acks before overwriting the area with the next
message, which normally have long arrived (workers read the step before they can join its first
all-reduce). A message larger than the area goes in parts. Cost: one pickle + one memcpy + one store on
rank 0 per step (see engine/bench/tp.py --device cpu for the measured round trip).
"""

from __future__ import annotations

import os
import pickle
import struct

from engine.parallel.comm.shm import Segment

try:
    from engine import _C
except ImportError:  # pragma: no cover
    _C = None

OK, ABORTED, TIMEOUT = 0, 1, 2


class MailboxClosed(Exception):
    """The group was aborted while waiting (rank 0 died or gave up)."""


class Mailbox:
    def __init__(self, seg: Segment, rank: int, spin_ns: int = 50_000, yield_ns: int = 0):
        self.seg = seg
        self.lay = seg.layout
        self.rank = rank
        self.world = seg.layout.world
        self.seq = seg.u32(self.lay.mb_seq)
        self.spin_ns, self.yield_ns = spin_ns, yield_ns
        self._seq_addr = seg.addr(self.lay.mb_seq)
        self._sleepers = seg.addr(self.lay.sleepers_off)
        self._abort = seg.addr(self.lay.abort_off)

    # -- rank 0 -----------------------------------------------------------------------------------------
    def send(self, msg, timeout_s: float = 300.0) -> int:
        """Returns the number of bytes sent. Raises MailboxClosed when the group is aborted meanwhile."""
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        cap = self.lay.mailbox_bytes
        parts = [data[i:i + cap] for i in range(0, len(data), cap)] or [b""]
        mm = self.seg.mm
        for k, part in enumerate(parts):
            for r in range(1, self.world):  # everybody has read the previous message
                st = _C.comm_wait_u32(self.seg.addr(self.lay.mb_ack(r)), self.seq, self._sleepers, self._abort,
                                      self.spin_ns, self.yield_ns, int(timeout_s * 1e9))
                if st != OK:
                    raise MailboxClosed("aborted" if st == ABORTED else "a worker did not read its messages")
            mm[self.lay.mb_data:self.lay.mb_data + len(part)] = part
            struct.pack_into("<QI", mm, self.lay.mb_size, len(part), int(k + 1 < len(parts)))
            self.seq = (self.seq + 1) & 0xFFFFFFFF
            _C.comm_signal_u32(self._seq_addr, self.seq, self._sleepers)
        return len(data)

    # -- workers ----------------------------------------------------------------------------------------
    def recv(self, alive=None, poll_s: float = 0.2):
        """Next message. ``alive()`` is asked every poll_s while idle; False ends the wait (MailboxClosed)."""
        chunks = []
        mm = self.seg.mm
        while True:
            target = (self.seq + 1) & 0xFFFFFFFF
            while True:
                st = _C.comm_wait_u32(self._seq_addr, target, self._sleepers, self._abort, self.spin_ns,
                                      self.yield_ns, int(poll_s * 1e9))
                if st == OK:
                    break
                if st == ABORTED or (alive is not None and not alive()):
                    raise MailboxClosed("the group was aborted")
            size, more = struct.unpack_from("<QI", mm, self.lay.mb_size)
            chunks.append(bytes(mm[self.lay.mb_data:self.lay.mb_data + size]))
            self.seq = target
            _C.comm_signal_u32(self.seg.addr(self.lay.mb_ack(self.rank)), target, self._sleepers)
            if not more:
                break
        return pickle.loads(b"".join(chunks))


def parent_alive(ppid: int) -> bool:
    return os.getppid() == ppid
