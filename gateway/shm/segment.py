"""One SysV shared-memory segment (``regions.py`` declares which the host has, and creates them).

A segment is created private (``IPC_PRIVATE``) and at once marked for removal: forked workers inherit the
mapping, a tool such as ``gateway status`` can still attach by id (Linux allows it), and the kernel frees
the memory when the last process detaches, so a ``kill -9`` of the whole tree leaks nothing.
I/O: shmget/shmat/shmctl system calls only.
"""

from __future__ import annotations

import sysv_ipc

__all__ = ["Segment"]


class Segment:
    """One mapped segment. ``buf`` is a writable memoryview of the whole segment."""

    def __init__(self, shm: sysv_ipc.SharedMemory) -> None:
        self._shm = shm
        self.id: int = shm.id
        self.size: int = shm.size
        self.buf = memoryview(shm)

    @classmethod
    def create(cls, size: int) -> Segment:
        # sysv_ipc fills a new segment with spaces unless told otherwise; every layout here expects zeros.
        shm = sysv_ipc.SharedMemory(
            sysv_ipc.IPC_PRIVATE, sysv_ipc.IPC_CREX, mode=0o600, size=size, init_character=b"\0"
        )
        shm.remove()
        return cls(shm)

    @classmethod
    def attach(cls, shm_id: int) -> Segment:
        return cls(sysv_ipc.attach(shm_id))

    def attached(self) -> int:
        """How many processes map this segment now (``shm_nattch``: a fork adds one, an exit removes one)."""
        return int(self._shm.number_attached)

    def close(self) -> None:
        self.buf.release()
        try:
            self._shm.detach()
        except sysv_ipc.Error:
            pass
