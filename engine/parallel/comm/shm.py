"""The POSIX shared-memory segment of one tensor-parallel group.

Rank 0 creates it with shm_open, sizes it, maps it and unlinks the name at once: the workers get the file
descriptor (inherited through ``subprocess.Popen(pass_fds=...)``) and map it too. So the segment has no
name in /dev/shm once the group exists, and the kernel frees it when the last rank exits, however it exits:
nothing can leak, even after kill -9.

Layout (offsets from the base; every region page-aligned; all counters start at zero):

========================  ===========================================================================
header (16 KiB)           magic, world; ``abort`` (non-zero: the group is dead; every wait gives up),
                          ``sleepers`` (futex waiters), per-rank GPU error words
mailbox control (16 KiB)  ``seq`` of the last message, its size and a "more parts" flag; per-rank acks
mailbox data              rank 0 -> workers messages (pickled StepInputs and commands)
host flags                [2 phases][world] sequence numbers, 128 bytes apart (csrc/comm/hostar.h)
GPU flags                 [world][MAX_BLOCKS] uint32 written by the mapped all-reduce kernel
GPU slots                 [2 parities][world][gpu_slot_bytes]: the zero-copy small-message buffers
host slots                [nslots][world][slot_bytes]: the host all-reduce / int8 / all-gather buffers
========================  ===========================================================================
"""

from __future__ import annotations

import mmap
import os
import secrets
import struct
from dataclasses import dataclass

import torch

MAGIC = 0x5054_4C52_5453_454B  # "KESTRLTP"
PAGE = 4096
MAX_BLOCKS = 64  # blocks (flags per rank) of the mapped GPU all-reduce


def _align(x: int, a: int = PAGE) -> int:
    return (x + a - 1) // a * a


@dataclass(frozen=True)
class Layout:
    world: int
    mailbox_bytes: int = 4 << 20
    slot_bytes: int = 4 << 20
    nslots: int = 4
    gpu_slot_bytes: int = 1 << 20

    # header
    abort_off = 64
    sleepers_off = 128
    err_off = 1024  # + 128 * rank (uint32 each, 64 ranks max)
    header_bytes = 16 << 10
    # mailbox control
    @property
    def mb_ctrl(self) -> int:
        return self.header_bytes

    @property
    def mb_seq(self) -> int:
        return self.mb_ctrl

    @property
    def mb_size(self) -> int:
        return self.mb_ctrl + 128  # uint64 payload bytes of this part, uint32 "more parts follow"

    def mb_ack(self, rank: int) -> int:
        return self.mb_ctrl + 256 + 128 * rank

    @property
    def mb_data(self) -> int:
        return self.mb_ctrl + (16 << 10)

    @property
    def flags(self) -> int:
        return _align(self.mb_data + self.mailbox_bytes)

    @property
    def gpu_flags(self) -> int:
        return _align(self.flags + 2 * self.world * 128)

    @property
    def gpu_slots(self) -> int:
        return _align(self.gpu_flags + self.world * MAX_BLOCKS * 4)

    @property
    def slots(self) -> int:
        return _align(self.gpu_slots + 2 * self.world * self.gpu_slot_bytes)

    @property
    def total(self) -> int:
        return _align(self.slots + self.nslots * self.world * self.slot_bytes)

    def err(self, rank: int) -> int:
        return self.err_off + 128 * rank


class Segment:
    """One mapping of the group's segment in this process."""

    def __init__(self, fd: int, layout: Layout, owner: bool):
        self.layout = layout
        self.fd = fd
        self.owner = owner
        self.mm = mmap.mmap(fd, layout.total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.buf = torch.frombuffer(self.mm, dtype=torch.uint8)  # a view for slicing; keeps no copy
        self.base = self.buf.data_ptr()
        self._closed = False

    @classmethod
    def create(cls, layout: Layout) -> Segment:
        import _posixshmem  # CPython's POSIX shm binding (what multiprocessing.shared_memory uses)

        name = f"/kestrel-tp-{os.getpid()}-{secrets.token_hex(4)}"
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            _posixshmem.shm_unlink(name)  # nameless from now on: freed with the last mapping / descriptor
            os.ftruncate(fd, layout.total)
            seg = cls(fd, layout, owner=True)
        except BaseException:
            os.close(fd)
            raise
        struct.pack_into("<QI", seg.mm, 0, MAGIC, layout.world)
        return seg

    @classmethod
    def attach(cls, fd: int, layout: Layout) -> Segment:
        seg = cls(fd, layout, owner=False)
        magic, world = struct.unpack_from("<QI", seg.mm, 0)
        if magic != MAGIC or world != layout.world:
            seg.close()
            raise RuntimeError("tensor parallelism: the shared-memory segment is not the group's")
        return seg

    # -- addresses and views --------------------------------------------------------------------------
    def addr(self, off: int) -> int:
        return self.base + off

    def view(self, off: int, nbytes: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        return self.buf[off:off + nbytes].view(dtype)

    def u32(self, off: int) -> int:
        return struct.unpack_from("<I", self.mm, off)[0]

    def set_u32(self, off: int, v: int) -> None:
        struct.pack_into("<I", self.mm, off, v & 0xFFFFFFFF)

    @property
    def aborted(self) -> bool:
        return not self._closed and self.u32(self.layout.abort_off) != 0

    def abort(self) -> None:
        if not self._closed:
            self.set_u32(self.layout.abort_off, 1)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.buf = None
        try:
            self.mm.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with the process
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass
