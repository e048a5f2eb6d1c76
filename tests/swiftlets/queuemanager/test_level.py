"""A priority level with packed swapped-out entries (:mod:`martinet.swiftlets.queuemanager.level`)
against a plain list of entries: every sequence of the operations a queue performs on it
leaves the same entries, with the same fields, in the same order; what it says it packed is
what its packs hold; and an entry it hands out to be kept (unpacked) is the one it keeps.

Packs are made small here (at most 5 entries, packed once 3 gathered) so that short
sequences join, split and empty them.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from martinet.messaging.message import build
from martinet.swiftlets.queuemanager import level as level_module
from martinet.swiftlets.queuemanager.entry import Entry
from martinet.swiftlets.queuemanager.level import Level


def fields(entry: Entry) -> tuple:
    kept = entry.head if entry.swapped else entry.message.raw
    return (entry.id, entry.swapped, entry.bytes, entry.delivery_count, entry.acquired, entry.expires, kept)


class Model:
    """The level under test and the list it must match."""

    def __init__(self) -> None:
        self.packed = 0
        self.level = Level(4, self._on_pack)
        self.entries: list[Entry] = []  # the reference: what the level holds, in order
        self.next_id = 1
        self.used: set[int] = set()  # ids are unique in a queue

    def _on_pack(self, count: int) -> None:
        self.packed += count

    def new(self, *, swapped: bool, expires: int | None, count: int, entry_id: int | None = None) -> Entry:
        while entry_id is None or entry_id in self.used:
            entry_id, self.next_id = self.next_id, self.next_id + 3  # (room for reinsertions between)
        self.used.add(entry_id)
        message = build(f"body {entry_id}".encode() * 3, durable=True, message_id=f"m{entry_id}")
        entry = Entry(entry_id, message, 4, expires, True, count, acquired=count > 0)
        if swapped:
            entry.swap(message.raw[:-8])
        return entry

    def check(self) -> None:
        assert [fields(e) for e in self.level] == [fields(e) for e in self.entries]
        assert len(self.level) == len(self.entries)
        assert self.packed == self.level.packed
        assert sum(1 for _ in self.level.in_memory()) + self.packed == len(self.entries)


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "append",
                "append-swapped",
                "swap",
                "popleft",
                "put-back",
                "insert",
                "remove",
                "unpack",
                "front",
                "expire",
                "pack",
            ]
        ),
        st.integers(0, 1000),
        st.sampled_from([None, None, 50, 150]),
    ),
    max_size=120,
)


@pytest.fixture
def small_packs(monkeypatch):  # (the same for every example: nothing else is set up)
    monkeypatch.setattr(level_module, "PACK_SIZE", 5)
    monkeypatch.setattr(level_module, "PACK_AFTER", 3)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS)
def test_a_level_holds_what_a_list_would(small_packs, operations):
    model = Model()
    level, entries = model.level, model.entries
    popped: list[Entry] = []
    for name, number, expires in operations:
        if name in ("append", "append-swapped"):
            entry = model.new(swapped=name == "append-swapped", expires=expires, count=number % 3)
            level.append(entry)
            entries.append(entry)
        elif name == "swap":  # an entry in memory becomes durable beyond the cache
            in_memory = [e for e in entries if not e.swapped]
            if in_memory:
                entry = in_memory[number % len(in_memory)]
                entry.swap(entry.message.raw[:-8])
                level.note_swapped()
        elif name == "popleft" and entries:
            got = level.popleft()
            assert fields(got) == fields(entries.pop(0))
            popped.append(got)
        elif name == "put-back" and popped:  # dispatch found it excluded or swapped out
            entry = popped.pop()
            level.appendleft(entry)
            entries.insert(0, entry)
        elif name == "insert":  # a released entry goes back to its place by id
            entry_id = number % (model.next_id + 1)
            if entry_id in model.used:
                continue
            entry = model.new(swapped=False, expires=None, count=1, entry_id=entry_id)
            level.insert_in_order(entry)
            index = next((i for i, e in enumerate(entries) if e.id > entry.id), len(entries))
            entries.insert(index, entry)
        elif name == "remove":  # a selector took an entry in memory
            in_memory = [e for e in entries if not e.swapped]
            if in_memory:
                entry = in_memory[number % len(in_memory)]
                level.remove(entry)  # (an entry in memory is never packed: it is in the level as itself)
                entries.remove(entry)
        elif name == "unpack":  # a read-back of every other entry from some point
            chosen = list(level)[number % (len(entries) + 1) :: 2]
            kept = level.unpack(chosen)
            assert kept == chosen
            for entry in kept:  # the level now holds these very objects
                assert any(held is entry for held in level.in_memory())
                entries[next(i for i, e in enumerate(entries) if e.id == entry.id)] = entry
        elif name == "front":  # a read-back for consumers without a selector
            most = number % 9 + 1
            found, size = level.swapped_front(most, 10**9 if number % 2 else 1)
            expected = [e for e in entries if e.swapped][: most if number % 2 else 1]
            assert [fields(e) for e in found] == [fields(e) for e in expected]
            assert size == sum(e.bytes for e in found)
            for entry in found:
                assert any(held is entry for held in level.in_memory())
                entries[next(i for i, e in enumerate(entries) if e.id == entry.id)] = entry
        elif name == "expire":
            taken = level.take_expired(100)
            expected = [e for e in entries if e.expires is not None and e.expires <= 100]
            assert [fields(e) for e in taken] == [fields(e) for e in expected]
            entries[:] = [e for e in entries if not (e.expires is not None and e.expires <= 100)]
        elif name == "pack":
            level.pack_tail()
        model.check()
    level.clear()
    assert (len(level), model.packed) == (0, 0)


def test_a_run_of_swapped_out_entries_is_packed_and_comes_out_in_order():
    model = Model()
    for _ in range(3000):
        entry = model.new(swapped=True, expires=None, count=0)
        model.level.append(entry)
        model.entries.append(entry)
    model.check()
    assert model.packed >= 3000 - level_module.PACK_AFTER  # all but the last few, not yet gathered
    assert [model.level.popleft().id for _ in range(3000)] == [e.id for e in model.entries]
    assert model.packed == 0
