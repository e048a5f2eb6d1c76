"""The pipes between the router and its store process: length-prefixed msgpack frames
(:mod:`.dbprocess`) read from a trio stream, and pipes large enough for a whole batch."""

from __future__ import annotations

import fcntl
from typing import Any

import trio

from .api import StoreError
from .dbprocess import LENGTH, unpack_frame

__all__ = ["FrameReader", "enlarge_pipe"]


def enlarge_pipe(fd: int) -> None:
    """Let a pipe hold a whole batch (Linux; 64 KiB by default), so the store process can take a
    batch without waiting for the busy trio loop to feed it 64 KiB at a time."""
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", 1031)
    for size in (4 << 20, 1 << 20):
        try:
            fcntl.fcntl(fd, setpipe, size)
            return
        except OSError:  # above /proc/sys/fs/pipe-max-size for an unprivileged user
            continue


class FrameReader:
    """Reads the store process's length-prefixed msgpack frames from a trio stream."""

    def __init__(self, stream: trio.abc.ReceiveStream):
        self._stream = stream
        self._buffer = bytearray()

    async def read(self) -> Any:
        """The next frame's body.

        Raises:
            StoreError: the store process closed its output (it exited).
        """
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                size = LENGTH.unpack_from(buffer)[0]
                if len(buffer) >= 4 + size:
                    with memoryview(buffer) as whole, whole[4 : 4 + size] as payload:
                        frame = unpack_frame(payload)  # (no copy of a batch of bodies before unpacking it)
                    del buffer[: 4 + size]
                    return frame
            data = await self._stream.receive_some(1 << 20)
            if not data:
                raise StoreError("the store process process exited")
            buffer += data

    async def aclose(self) -> None:
        await self._stream.aclose()
