"""The store lock: one store process per store (the chaos harness saw a router
restarted at once after ``kill -9`` open its store empty while the killed router's store
process was still applying its last commits). Real store processes on a real SQLite file;
the commit gate (a test hook of :mod:`swiftlets.store.dbprocess`) holds the old process in
the middle of its work for as long as the test needs, without timing assumptions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from martinet.messaging.message import build
from martinet.swiftlets.store.api import PutMessage
from martinet.swiftlets.store.batches import encode_ops
from martinet.swiftlets.store.dbprocess import (
    COMMIT_GATE_ENV,
    LENGTH,
    DatabaseError,
    lock_store,
    pack_frame,
    unpack_frame,
)

COMMITS = 20


class StoreProcess:
    """A ``python -m martinet.swiftlets.store`` process spoken to as the router does (stdin, stdout)."""

    def __init__(self, process: trio.Process):
        self.process = process
        self._buffer = b""

    @classmethod
    async def start(cls, path: Path, env: dict[str, str] | None = None) -> StoreProcess:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "martinet.swiftlets.store", str(path), "normal", "refuse-empty"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )
        return cls(process)

    async def read(self) -> list:
        assert self.process.stdout is not None
        while True:
            if len(self._buffer) >= 4:
                size = LENGTH.unpack(self._buffer[:4])[0]
                if len(self._buffer) >= 4 + size:
                    frame, self._buffer = self._buffer[4 : 4 + size], self._buffer[4 + size :]
                    return unpack_frame(frame)
            data = await self.process.stdout.receive_some()
            assert data, "the store process closed its output"
            self._buffer += data

    async def recover(self) -> list[int]:
        """The ids of the recovered messages (reads up to ``ready``)."""
        ids: list[int] = []
        while (frame := await self.read())[0] != "ready":
            assert frame[0] in ("messages", "records", "remembered"), frame
            if frame[0] == "messages":
                ids.extend(row[0] for row in frame[1])
        return ids

    async def send(self, body: list) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(pack_frame(body))

    async def die(self) -> None:
        """As when the router is killed: its ends of the pipes close."""
        assert self.process.stdin is not None and self.process.stdout is not None
        await self.process.stdin.aclose()
        await self.process.stdout.aclose()


def stored(n: int) -> list:
    return ["commit", encode_ops([PutMessage(n, "q", build(b"m%d" % n, durable=True).raw)])]


async def test_a_new_store_process_waits_for_the_previous_one_and_recovers_all_it_committed(tmp_path):
    path, gate = tmp_path / "r.sqlite", tmp_path / "gate"
    with trio.fail_after(60):
        old = await StoreProcess.start(path, {COMMIT_GATE_ENV: str(gate)})
        assert await old.recover() == []
        await old.send(stored(1))
        assert await old.read() == ["done", 0]
        gate.touch()  # the old process stops before its next commit
        for n in range(2, COMMITS + 1):
            await old.send(stored(n))
        await old.die()  # its router is killed with these commits in the pipe

        new = await StoreProcess.start(path)
        notice = await new.read()  # before the lock: "ready" at once, with message 1 only
        assert notice == [
            "notice",
            f"waiting for the previous store process of {path} (pid {old.process.pid}) to finish",
        ]
        gate.unlink()
        assert await new.recover() == list(range(1, COMMITS + 1))  # everything the old one applied
        assert await old.process.wait() == 0  # it applied what it was given, then left
        await new.die()
        assert await new.process.wait() == 0
    assert path.with_name(path.name + ".lock").read_text().strip() == str(new.process.pid)


async def test_waiting_for_the_store_lock_in_vain_names_the_holder(tmp_path):
    path, gate = tmp_path / "r.sqlite", tmp_path / "gate"
    with trio.fail_after(60):
        holder = await StoreProcess.start(path, {COMMIT_GATE_ENV: str(gate)})
        assert await holder.recover() == []
        gate.touch()
        await holder.send(stored(1))  # held at the gate, the lock with it
        notices: list[str] = []
        with pytest.raises(DatabaseError) as raised:
            await trio.to_thread.run_sync(lock_store, str(path), notices.append, 0.2)
        assert str(raised.value) == (
            f"{path}: the previous store process (pid {holder.process.pid}) still holds "
            f"the store lock {path}.lock after 0.2 s — refusing to open the store beside it"
        )
        assert notices == [f"waiting for the previous store process of {path} (pid {holder.process.pid}) to finish"]
        gate.unlink()
        assert await holder.read() == ["done", 0]
        await holder.die()
        assert await holder.process.wait() == 0
        fd = await trio.to_thread.run_sync(lock_store, str(path), notices.append, 0.2)  # free now
        os.close(fd)
    assert len(notices) == 1


async def test_a_second_router_on_a_held_store_names_the_running_router_at_once(broker):
    # a second router started on the same config (the same folder, so the same store file)
    # while the first runs: it must fail at once, naming the router that holds the store,
    # not wait for a "previous store process" that is in fact a live router's
    from martinet.kernel import Router, SwiftletFailed

    database = broker.store.database
    with trio.fail_after(20), pytest.raises(SwiftletFailed) as failed:  # (the lock wait alone is 30 s)
        await Router.from_file(broker.path).run()
    assert str(failed.value.cause) == (
        f"{database}: the store is in use by the running router r1 (pid {os.getpid()}); "
        "a store serves one router: stop that router first, or give this one another store path"
    )
    assert broker.queue_manager.queue("q", create=True) is not None  # the first one runs on
