"""Reads of stored message bodies (the bodies a queue does not keep in memory), served
beside the commits: the store process answers them from a thread of its own on a second pair
of pipes, so a read never waits for a group commit, and sees every commit confirmed before
it. The reads waiting at one moment go as one request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import trio

from .api import StoreError
from .dbprocess import pack_frame
from .pipes import FrameReader

__all__ = ["BodyReads"]


class _Read:
    """One :meth:`BodyReads.read` waiting to be served."""

    __slots__ = ("ids", "done", "bodies", "error")

    def __init__(self, ids: list[int]):
        self.ids = ids
        self.done = trio.Event()
        self.bodies: dict[int, bytes] = {}
        self.error: str | None = None


class BodyReads:
    """The reads of one store: ``requests`` and ``answers``, the pipes to the store process's reader."""

    def __init__(self, path: Path, requests: trio.abc.SendStream, answers: FrameReader):
        self.path = path
        self._input = requests
        self._output = answers
        self._reads: list[_Read] = []
        self._wakeup = trio.Event()

    async def read(self, ids: Sequence[int]) -> Mapping[int, bytes]:
        """The stored bodies of those of ``ids`` that exist (reads waiting together go as one request)."""
        read = _Read(list(ids))
        if not read.ids:
            return {}
        self._reads.append(read)
        self._wakeup.set()
        await read.done.wait()
        if read.error is not None:
            raise StoreError(f"{self.path}: read failed: {read.error}")
        return read.bodies

    async def run(self) -> None:
        """Serve the reads until cancelled (the store stops).

        Raises:
            StoreError: the store process is gone.
        """
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            while self._reads:
                try:
                    await self._serve()
                except (StoreError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    raise StoreError(f"{self.path}: the store process is gone: {exc}") from exc

    async def _serve(self) -> None:
        """Answer every waiting read with one request to the store process's reader."""
        reads, self._reads = self._reads, []
        wanted = sorted({message_id for read in reads for message_id in read.ids})
        assert self._input is not None and self._output is not None  # run() started the store process
        try:
            with trio.CancelScope(shield=True):  # once asked, the answer must be taken off the pipe
                await self._input.send_all(pack_frame(["read", wanted]))
                reply = await self._output.read()
        except BaseException as exc:
            for read in reads:
                read.error = f"{type(exc).__name__}: {exc}"
                read.done.set()
            raise
        if reply[0] == "bodies":
            bodies = dict(reply[1])
            for read in reads:
                read.bodies = {i: bodies[i] for i in read.ids if i in bodies}
        else:
            for read in reads:
                read.error = str(reply[1]) if len(reply) > 1 else repr(reply)
        for read in reads:
            read.done.set()

    async def aclose(self, why: str) -> None:
        """The store stops: the reads waiting fail with ``why``, and the pipes close."""
        reads, self._reads = self._reads, []
        for read in reads:
            read.error = why
            read.done.set()
        await self._input.aclose()
        await self._output.aclose()
