"""One priority level of a queue: its available entries in delivery order, with the
swapped-out ones packed.

Theory of operation
-------------------
A deep queue is mostly swapped-out entries: the store has their bytes, and the queue keeps
what selectors, expiry and the redelivery header read. Kept as an :class:`.entry.Entry`
each, such an entry costs some 260 bytes of memory besides its leading sections (the
object, its id and size as ints, a bytes object for the sections, a deque slot): ten
million stored messages would need 3 GB. So a stretch of swapped-out entries is kept as a
:class:`Pack`: their ids, sizes, delivery counts and (if any has one) expiry times in
arrays, their leading sections back to back in one bytearray, compressed once the pack is
full (:meth:`Pack.seal`). That is 20 bytes per entry besides its compressed sections, plus
the allocator's slack: 59 bytes of RSS per stored JMS-like message with a uuid message-id
(``bench/memory_bench.py``, 2,000,000 messages).

A :class:`Level` is a deque of items, each an entry or a pack. Iterating it, or popping its
front, yields entries either way: a packed one comes out as a new :class:`.entry.Entry`
made for the occasion (swapped out, available), so what only reads entries (selectors,
expiry, browsing) treats both alike. What must find the same entry again — a read-back
fills it in place — first takes it out of its pack (:meth:`Level.unpack`). Packing happens
at the tail, where swapped-out entries arrive (a send beyond the cache is swapped out once
it is durable, in the order it was added), once :data:`PACK_AFTER` loose ones have
gathered there (:meth:`Level.note_swapped`).
"""

from __future__ import annotations

import zlib
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice

from .entry import Entry

__all__ = ["Level", "Pack", "PACK_AFTER", "PACK_SIZE"]

#: Entries in one pack at most: a pack split in the middle (a read-back, a reinsertion) is
#: copied, so that copy stays small; and a pack's popped front is freed only with the pack.
PACK_SIZE = 1024
#: Loose swapped-out entries that gather at a level's tail before they are packed: fewer, and
#: a pack costs more than the entries it holds; the walk that packs them is paid per batch.
PACK_AFTER = 64
_NO_EXPIRY = -1


class Pack:
    """Swapped-out available entries of one priority, in delivery order, in arrays. Members
    before ``start`` have been popped (their room is freed with the pack). A full pack is
    sealed: its leading sections are compressed (:meth:`seal`) until it is consumed from."""

    __slots__ = ("ids", "sizes", "counts", "expires", "heads", "ends", "zipped", "start")

    def __init__(self) -> None:
        self.ids = array("q")
        self.sizes = array("I")
        self.counts = array("I")  # delivery count << 1 | acquired
        self.expires: array[int] | None = None  # made when the first member that expires comes
        # the members' leading sections back to back (empty while zipped; bytes once unsealed)
        self.heads: bytes | bytearray = bytearray()
        self.ends = array("I")  # where each member's leading sections end in heads
        self.zipped: bytes | None = None  # heads, compressed, once sealed
        self.start = 0

    @staticmethod
    def packable(entry: Entry) -> bool:
        return entry.swapped and entry.bytes < 1 << 32 and entry.delivery_count < 1 << 30

    def add(self, entry: Entry) -> None:
        """Append ``entry`` (swapped out, :meth:`packable`; the pack is not sealed)."""
        self.ids.append(entry.id)
        self.sizes.append(entry.bytes)
        self.counts.append(entry.delivery_count << 1 | entry.acquired)
        expires = entry.expires
        if expires is not None and self.expires is None:
            self.expires = array("q", [_NO_EXPIRY]) * len(self.ends)
        if self.expires is not None:
            self.expires.append(_NO_EXPIRY if expires is None else expires)
        self.heads += entry.head
        self.ends.append(len(self.heads))

    def seal(self) -> None:
        """Compress the leading sections (the pack is full: nothing is added any more).
        Messages of one queue share most of what these sections hold — property names,
        types, the prefix of their ids — so zlib's fastest level takes 1,024 JMS-like
        ones with uuid message-ids from 103 to 32 bytes each, in 0.7 µs per entry; reading
        them back costs 0.3 µs per entry."""
        self.zipped = zlib.compress(self.heads, 1)
        self.heads = bytearray()

    def plain(self) -> bytes | bytearray:
        """The leading sections, decompressed if the pack is sealed (not kept)."""
        return self.heads if self.zipped is None else zlib.decompress(self.zipped)

    def unseal(self) -> None:
        """Keep the leading sections decompressed (the pack is being consumed from its front)."""
        if self.zipped is not None:
            self.heads, self.zipped = zlib.decompress(self.zipped), None

    def __len__(self) -> int:
        return len(self.ids) - self.start

    def entry(self, index: int, priority: int, heads: bytes | bytearray) -> Entry:
        """Member ``index`` (counted from the first, popped ones included) as an entry;
        ``heads``: :meth:`plain`."""
        expires = None if self.expires is None else self.expires[index]
        count = self.counts[index]
        return Entry.swapped_out(
            self.ids[index],
            bytes(heads[self.ends[index - 1] if index else 0 : self.ends[index]]),
            priority,
            None if expires == _NO_EXPIRY else expires,
            count >> 1,
            bool(count & 1),
            self.sizes[index],
        )

    def take_front(self, most: int, most_bytes: int, priority: int) -> tuple[list[Entry], int]:
        """Take the first members off the pack as entries: ``most`` at most, or as many as
        reach ``most_bytes``; and their bytes. (A read-back of a queue's front: this runs
        for each message consumed from the store, so it is written for speed.)"""
        self.unseal()  # (consumed from here on: decompressed once)
        ids, sizes, counts, ends, expires = self.ids, self.sizes, self.counts, self.ends, self.expires
        heads = self.heads if isinstance(self.heads, bytes) else bytes(self.heads)  # (slices of it are kept)
        new = Entry.swapped_out
        taken: list[Entry] = []
        total, index, stop = 0, self.start, min(len(ids), self.start + most)
        begin = ends[index - 1] if index else 0
        while index < stop and total < most_bytes:
            end, count, size = ends[index], counts[index], sizes[index]
            at = _NO_EXPIRY if expires is None else expires[index]
            taken.append(
                new(
                    ids[index],
                    heads[begin:end],
                    priority,
                    None if at == _NO_EXPIRY else at,
                    count >> 1,
                    bool(count & 1),
                    size,
                )
            )
            total += size
            begin = end
            index += 1
        self.start = index
        return taken, total

    def entries(self, priority: int) -> Iterator[Entry]:
        heads = self.plain()
        for index in range(self.start, len(self.ids)):
            yield self.entry(index, priority, heads)

    @property
    def first_id(self) -> int:
        return self.ids[self.start]


def _packs(entries: list[Entry]) -> list[Pack]:
    """``entries`` in packs, the full ones sealed."""
    packs = []
    for first in range(0, len(entries), PACK_SIZE):
        pack = Pack()
        for entry in entries[first : first + PACK_SIZE]:
            pack.add(entry)
        if len(pack.ids) == PACK_SIZE:
            pack.seal()
        packs.append(pack)
    return packs


class Level:
    """The available entries of one priority in delivery order, the swapped-out ones packed.

    ``on_pack(n)`` is told when ``n`` entries go into packs (negative: come out), so that
    the queue counts the memory they save."""

    __slots__ = ("priority", "_items", "count", "_loose", "_pack_after", "_on_pack")

    def __init__(self, priority: int, on_pack: Callable[[int], None]):
        self.priority = priority
        self._items: deque[Entry | Pack] = deque()
        self.count = 0  # entries (read only)
        self._loose = 0  # swapped-out entries noted since the last packing walk
        self._pack_after = PACK_AFTER  # loose ones that start the next walk
        self._on_pack = on_pack

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Entry]:
        priority = self.priority
        for item in self._items:
            if isinstance(item, Pack):
                yield from item.entries(priority)
            else:
                yield item

    def snapshot(self) -> Iterator[Entry]:
        """The entries as they are now, made as they are reached: the level's items (an
        entry or a pack each) are copied at once; a pack's members from its front as it is
        then (those taken off it meanwhile are left out)."""
        items, priority = list(self._items), self.priority

        def entries() -> Iterator[Entry]:
            for item in items:
                if isinstance(item, Pack):
                    yield from item.entries(priority)
                else:
                    yield item

        return entries()

    @property
    def packed(self) -> int:
        """Entries in packs."""
        return sum(len(item) for item in self._items if isinstance(item, Pack))

    def in_memory(self) -> Iterator[Entry]:
        """The entries not packed."""
        return (item for item in self._items if not isinstance(item, Pack))

    # -- at the ends ---------------------------------------------------------------------------

    def append(self, entry: Entry) -> None:
        self._items.append(entry)
        self.count += 1
        if entry.swapped:  # (recovered: restored swapped out, in order)
            self.note_swapped()

    def appendleft(self, entry: Entry) -> None:
        self._items.appendleft(entry)
        self.count += 1

    def popleft(self) -> Entry:
        items = self._items
        pack = items[0]
        self.count -= 1
        if not isinstance(pack, Pack):
            items.popleft()
            return pack
        pack.unseal()
        entry = pack.entry(pack.start, self.priority, pack.heads)
        pack.start += 1
        if not len(pack):
            items.popleft()
        self._on_pack(-1)
        return entry

    @property
    def last_id(self) -> int:
        last = self._items[-1]
        return last.ids[-1] if isinstance(last, Pack) else last.id

    # -- packing ------------------------------------------------------------------------------

    def note_swapped(self) -> None:
        """One of this level's entries was swapped out; pack the tail's once enough gathered."""
        self._loose += 1
        if self._loose >= self._pack_after:
            self.pack_tail()

    def pack_tail(self) -> None:
        """Pack the stretch of loose swapped-out entries nearest the tail (behind it, entries
        not swapped out: sends whose commit is not durable yet). The stretch ends at a pack,
        which it joins while that has room, or at an entry that is not swapped out. The walk
        passes over the entries behind the stretch, so the next walk waits for as many loose
        ones as it passed over: a long tail of sends in flight costs no more per entry."""
        self._loose = 0
        items = self._items
        behind = 0
        for item in reversed(items):
            if isinstance(item, Pack) or item.swapped:
                break
            behind += 1
        self._pack_after = max(PACK_AFTER, behind)
        length = 0
        for item in islice(reversed(items), behind, None):
            if isinstance(item, Pack) or not Pack.packable(item):
                break
            length += 1
        before = len(items) - behind - length - 1
        joined = items[before] if before >= 0 else None
        if length < PACK_AFTER and not (length and isinstance(joined, Pack) and len(joined.ids) < PACK_SIZE):
            return
        items.rotate(behind)  # the stretch at the right end
        stretch: list[Entry] = [items.pop() for _ in range(length)]  # type: ignore[misc]  # (entries: counted above)
        stretch.reverse()
        if isinstance(joined, Pack) and len(joined.ids) < PACK_SIZE:
            room = PACK_SIZE - len(joined.ids)
            for entry in stretch[:room]:
                joined.add(entry)
            if len(joined.ids) == PACK_SIZE:
                joined.seal()
            stretch = stretch[room:]
        items.extend(_packs(stretch))
        items.rotate(-behind)
        self._on_pack(length)

    def swapped_front(self, most: int, most_bytes: int) -> tuple[list[Entry], int]:
        """The first swapped-out entries, each now in the level as itself (taken out of its
        pack): ``most`` of them at most, or as many as reach ``most_bytes``; and their bytes.
        (What a read-back for consumers without a selector asks for: :meth:`unpack` would do,
        but this makes no entry it does not keep.)"""
        items = self._items
        found: list[Entry] = []
        total = start = 0
        while len(found) < most and total < most_bytes:
            index = start
            for index, item in enumerate(islice(items, start, None), start):  # noqa: B007 - where it stopped
                if isinstance(item, Pack):
                    break
                if item.swapped:
                    found.append(item)
                    total += item.bytes
                    if len(found) >= most or total >= most_bytes:
                        return found, total
            else:
                return found, total  # no pack left
            pack: Pack = items[index]  # type: ignore[assignment]  # (where the loop broke)
            taken, size = pack.take_front(most - len(found), most_bytes - total, self.priority)
            found += taken
            total += size
            if not len(pack):
                del items[index]
            items.rotate(-index)
            items.extendleft(reversed(taken))
            items.rotate(index)
            start = index + len(taken)
            self._on_pack(-len(taken))
        return found, total

    def unpack(self, entries: Iterable[Entry]) -> list[Entry]:
        """``entries`` of this level (as iterating it gave them), each now in the level as
        itself: a packed one is taken out of its pack and kept in its place."""
        entries = list(entries)
        wanted = {entry.id: entry for entry in entries if entry.swapped}
        items, rebuilt = self._items, deque[Entry | Pack]()
        unpacked = 0
        while items and wanted:
            item = items.popleft()
            if not isinstance(item, Pack):
                wanted.pop(item.id, None)
                rebuilt.append(item)
                continue
            pack, ids, start = item, item.ids, item.start
            if not any(ids[index] in wanted for index in range(start, len(ids))):
                rebuilt.append(pack)
                continue
            front = start
            while front < len(ids) and ids[front] in wanted:
                front += 1
            if not any(ids[index] in wanted for index in range(front, len(ids))):
                # a read-back of the queue's front: its first members come off the pack,
                # which stays as it is (sealed, if it was)
                rebuilt.extend(wanted.pop(ids[index]) for index in range(start, front))
                unpacked += front - start
                pack.start = front
                if len(pack):
                    rebuilt.append(pack)
                continue
            stretch: list[Entry] = []
            heads = pack.plain()
            for index in range(start, len(ids)):
                entry = wanted.pop(ids[index], None)
                if entry is None:
                    stretch.append(pack.entry(index, self.priority, heads))
                    continue
                unpacked += 1 + self._settle(stretch, rebuilt)
                rebuilt.append(entry)
            unpacked += self._settle(stretch, rebuilt)
        rebuilt.extend(items)
        self._items = rebuilt
        self._on_pack(-unpacked)
        return entries

    @staticmethod
    def _settle(stretch: list[Entry], into: deque[Entry | Pack]) -> int:
        """Put what is left of a pack being split into ``into``: packed again if it is long
        enough to be worth a pack, else as entries (how many are no longer packed)."""
        count = len(stretch)
        if count >= PACK_AFTER:
            into.extend(_packs(stretch))
            count = 0
        else:
            into.extend(stretch)
        stretch.clear()
        return count

    # -- in the middle -----------------------------------------------------------------------

    def remove(self, entry: Entry) -> None:
        """Take out ``entry``, which is in the level as itself (not packed)."""
        self._items.remove(entry)
        self.count -= 1

    def insert_in_order(self, entry: Entry) -> None:
        """Put ``entry`` before the first entry with a higher id (at the tail if none)."""
        items = self._items
        if not items or self.last_id < entry.id:
            self.append(entry)
            return
        for index, item in enumerate(items):
            if not isinstance(item, Pack):
                if item.id > entry.id:
                    break
                continue
            pack = item
            if pack.first_id > entry.id:
                break
            if pack.ids[-1] > entry.id:  # in the pack: split it there
                members = list(pack.entries(self.priority))
                split = next(i for i, member in enumerate(members) if member.id > entry.id)
                del items[index]
                rebuilt: deque[Entry | Pack] = deque()
                unpacked = self._settle(members[:split], rebuilt)
                rebuilt.append(entry)
                unpacked += self._settle(members[split:], rebuilt)
                items.rotate(-index)
                items.extendleft(reversed(rebuilt))
                items.rotate(index)
                self.count += 1
                self._on_pack(-unpacked)
                return
        else:
            index = len(items)
        items.insert(index, entry)
        self.count += 1

    def take_expired(self, now: int) -> list[Entry]:
        """Take out every entry expired at ``now`` (ms since the epoch) and return them (a
        pack none of whose members expires is passed over)."""
        taken: list[Entry] = []
        rebuilt: deque[Entry | Pack] = deque()
        unpacked = 0
        for item in self._items:
            if not isinstance(item, Pack):
                expires = item.expires
                if expires is not None and expires <= now:
                    taken.append(item)
                else:
                    rebuilt.append(item)
                continue
            pack = item
            if pack.expires is None or not any(0 <= at <= now for at in pack.expires[pack.start :]):
                rebuilt.append(pack)
                continue
            staying: list[Entry] = []
            for member in pack.entries(self.priority):
                expires = member.expires
                (taken if expires is not None and expires <= now else staying).append(member)
            unpacked += len(pack) - len(staying) + self._settle(staying, rebuilt)
        self._items = rebuilt
        self.count -= len(taken)
        self._on_pack(-unpacked)
        return taken

    def clear(self) -> None:
        self._on_pack(-self.packed)
        self._items.clear()
        self.count = 0
        self._loose = 0
