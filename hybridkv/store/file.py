"""`file:///dir?size=20GiB`: blocks in object files of a local directory.

Small blocks make many small I/Os, so blocks are written in objects of
about `object_bytes` (default 4 MiB, see benchmarks/RESULTS.md): puts fill
an open object in memory (readable at once) that is written as one file
when full, on `flush` and on `close`. A file is written under a temporary
name and renamed into place, so a reader never sees half an object.

    object file: "HKVO" | version u16 | count u32 | index bytes u32 |
                 count x (key length u16, key, offset u64, length u32) | values

The directory is bounded in bytes: whole objects are deleted, least
recently read or written first. A later process opening the directory
reads the object indexes back (modification time gives the LRU order) and
serves what an earlier one stored; files that do not parse are deleted.

`shared=True` (`?shared=1`): processes use the directory at the same time.
Each put then writes its blocks as an object at once (others see them),
a missed key makes the store read the directory again for objects others
wrote (at most every RESCAN_SECONDS), and temporary files younger than
STALE_TMP_SECONDS (another process's object being written) are left alone.
Each process bounds the directory by its own view of it; an object another
process deleted is a miss.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

from hybridkv.store.base import KVStore, StoreError, StoreStats, leading_count, pop_entry

DEFAULT_OBJECT_BYTES = 4 << 20
SUFFIX = ".hkvo"
_HEADER = struct.Struct("<4sHII")
_ENTRY = struct.Struct("<HQI")  # key length, offset, length (the key follows its length)
_MAGIC, _VERSION = b"HKVO", 1
_names = itertools.count()
RESCAN_SECONDS = 0.5
STALE_TMP_SECONDS = 60.0


class _Object:
    """One object file: its name, size and the keys it holds (some maybe deleted)."""

    __slots__ = ("name", "size", "keys", "live")

    def __init__(self, name: str, size: int, keys: list[bytes]) -> None:
        self.name, self.size, self.keys, self.live = name, size, keys, len(keys)


class FileStore(KVStore):
    """Blocks in object files under `directory`, at most `capacity_bytes` in all."""

    scheme = "file"

    def __init__(self, directory: str, capacity_bytes: int,
                 object_bytes: int = DEFAULT_OBJECT_BYTES, *, shared: bool = False) -> None:
        for name, value in (("size", capacity_bytes), ("object_size", object_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"file store: {name} must be a positive number of bytes, "
                                 f"got {value!r}")
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise ValueError(f"file store: cannot use directory {directory!r}: {e}") from None
        self.directory = directory
        self.capacity_bytes = capacity_bytes
        self.object_bytes = min(object_bytes, capacity_bytes)
        self._index: dict[bytes, tuple[str, int, int]] = {}  # key -> (object, offset, length)
        self._objects: OrderedDict[str, _Object] = OrderedDict()  # least recent first
        self._open: dict[bytes, bytes] = {}  # the object being filled
        self._open_bytes = 0
        self._sealed: dict[bytes, bytes] = {}  # objects being written (readable meanwhile)
        self._used = 0
        self._evicted = 0
        self._lock = threading.RLock()
        self.shared = bool(shared)
        self._scanned_at = time.monotonic()
        self._load_existing()

    def describe(self) -> str:
        return f"file://{self.directory}"

    # ---- writing ---------------------------------------------------------------

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> int:
        if len(keys) != len(values):
            raise ValueError(f"put: {len(keys)} keys but {len(values)} values")
        stored = 0
        full: list[dict[bytes, bytes]] = []
        with self._lock:
            for key, value in zip(keys, values):
                if len(value) + len(key) > self.capacity_bytes:
                    continue
                stored += 1
                if key in self._open or key in self._sealed:
                    continue
                entry = self._index.get(key)
                if entry is not None:  # stored already: refresh its object
                    self._objects.move_to_end(entry[0])
                    continue
                self._open[key] = value
                self._open_bytes += len(key) + len(value)
                if self._open_bytes >= self.object_bytes:
                    full.append(self._seal())
            if self.shared and self._open:
                full.append(self._seal())
        for entries in full:
            self._write(entries)
        return stored

    def _seal(self) -> dict[bytes, bytes]:
        """Close the open object (lock held); it stays readable until written."""
        entries, self._open, self._open_bytes = self._open, {}, 0
        self._sealed.update(entries)
        return entries

    def flush(self) -> None:
        """Write the open object to its file now."""
        with self._lock:
            if not self._open:
                return
            entries = self._seal()
        self._write(entries)

    def _write(self, entries: dict[bytes, bytes]) -> None:
        """Write a sealed object and index it."""
        try:
            name, size, offsets = self._write_object(entries)
        except OSError as e:
            with self._lock:
                for key in entries:
                    self._sealed.pop(key, None)
            raise StoreError(f"file store {self.directory}: writing an object failed: {e}") \
                from None
        with self._lock:
            for key, (offset, length) in offsets.items():
                self._sealed.pop(key, None)
                self._index[key] = (name, offset, length)
            if name not in self._objects:  # (a rescan may have found it first)
                self._objects[name] = _Object(name, size, list(offsets))
                self._used += size
            self._evict()

    def _write_object(self, entries: dict[bytes, bytes]
                      ) -> tuple[str, int, dict[bytes, tuple[int, int]]]:
        index_bytes = sum(_ENTRY.size + len(k) for k in entries)
        offset = _HEADER.size + index_bytes
        parts = [_HEADER.pack(_MAGIC, _VERSION, len(entries), index_bytes)]
        offsets = {}
        for key, value in entries.items():
            parts.append(_ENTRY.pack(len(key), offset, len(value)) + key)
            offsets[key] = (offset, len(value))
            offset += len(value)
        parts += entries.values()
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(_names)}{SUFFIX}"
        tmp = os.path.join(self.directory, f".tmp-{name}")
        with open(tmp, "wb") as f:
            f.writelines(parts)
        os.replace(tmp, os.path.join(self.directory, name))
        return name, offset, offsets

    def _evict(self) -> None:
        """Delete least recent objects until the bound holds (lock held)."""
        while self._used > self.capacity_bytes and self._objects:
            _, obj = self._objects.popitem(last=False)
            self._drop_object(obj)
            self._evicted += 1

    def _drop_object(self, obj: _Object) -> None:
        for key in obj.keys:
            entry = self._index.get(key)
            if entry is not None and entry[0] == obj.name:
                del self._index[key]
        self._used -= obj.size
        try:
            os.remove(os.path.join(self.directory, obj.name))
        except FileNotFoundError:
            pass

    # ---- reading -----------------------------------------------------------------

    def get(self, keys: Sequence[bytes]) -> list[bytes]:
        self._rescan_if_missing(keys)
        plan: list[bytes | tuple[str, int, int]] = []
        with self._lock:
            for key in keys:
                value = self._open.get(key) or self._sealed.get(key)
                entry = self._index.get(key) if value is None else None
                if value is None and entry is None:
                    break
                plan.append(value if value is not None else entry)  # type: ignore[arg-type]
        out: list[bytes] = []
        files: dict[str, int] = {}
        try:
            i = 0
            while i < len(plan):
                item = plan[i]
                if isinstance(item, bytes):
                    out.append(item)
                    i += 1
                    continue
                end = _run_end(plan, i)  # entries i..end-1: adjacent in one object
                values = self._read(files, plan[i:end])  # type: ignore[arg-type]
                out += values
                if len(values) < end - i:
                    break
                i = end
        finally:
            for fd in files.values():
                os.close(fd)
        self._refresh([item[0] for item in plan[:len(out)] if not isinstance(item, bytes)])
        return out

    def _read(self, files: dict[str, int], run: list[tuple[str, int, int]]) -> list[bytes]:
        """Values of a run of adjacent entries of one object, read at once
        (fewer if the object is gone or cut short)."""
        name, start = run[0][0], run[0][1]
        size = run[-1][1] + run[-1][2] - start
        try:
            fd = files.get(name)
            if fd is None:
                fd = files[name] = os.open(os.path.join(self.directory, name), os.O_RDONLY)
            data = os.pread(fd, size, start)
        except FileNotFoundError:  # evicted meanwhile: a miss
            return []
        except OSError as e:
            raise StoreError(f"file store {self.directory}: reading {name} failed: {e}") \
                from None
        view = memoryview(data)
        out = []
        for _, offset, length in run:
            if offset - start + length > len(data):
                break
            out.append(bytes(view[offset - start:offset - start + length]) if len(run) > 1
                       else data)
        return out

    def _refresh(self, names: list[str]) -> None:
        """Read objects become the most recent, the one holding the run's head last."""
        seen = list(dict.fromkeys(reversed(names)))
        with self._lock:
            for name in seen:
                if name in self._objects:
                    self._objects.move_to_end(name)
        now = time.time()
        for name in seen:
            try:
                os.utime(os.path.join(self.directory, name), (now, now))
            except OSError:
                pass

    def _holds(self, key: bytes) -> bool:
        return key in self._index or key in self._open or key in self._sealed

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._rescan_if_missing(keys)
        with self._lock:
            return [self._holds(k) for k in keys]

    def prefix_length(self, keys: Sequence[bytes]) -> int:
        self._rescan_if_missing(keys)
        with self._lock:
            return leading_count(map(self._holds, keys))

    def _rescan_if_missing(self, keys: Sequence[bytes]) -> None:
        """Shared: index the objects other processes wrote since the last look,
        when a key is missing and the last look is RESCAN_SECONDS old."""
        if not self.shared or time.monotonic() - self._scanned_at < RESCAN_SECONDS:
            return
        with self._lock:
            if all(map(self._holds, keys)):
                return
            known = set(self._objects)
        self._scanned_at = time.monotonic()
        found = [(mtime, name, size) for mtime, name, size in self._listing()
                 if name not in known]
        self._index_objects(sorted(found), delete_bad=False)

    def delete(self, keys: Sequence[bytes]) -> int:
        """Forget keys (a key in a kept object may be seen again by a later process)."""
        removed = 0
        with self._lock:
            for key in keys:
                freed = pop_entry(self._open, key)
                if freed:
                    self._open_bytes -= freed
                    removed += 1
                    continue
                entry = self._index.pop(key, None)
                if entry is None:
                    continue
                removed += 1
                obj = self._objects.get(entry[0])
                if obj is not None:
                    obj.live -= 1
                    if obj.live == 0:
                        del self._objects[obj.name]
                        self._drop_object(obj)
        return removed

    # ---- admin -----------------------------------------------------------------------

    def stats(self) -> StoreStats:
        with self._lock:
            keys = len(self._index) + len(self._open) + len(self._sealed)
            return StoreStats("file", keys, self._used + self._open_bytes, self.capacity_bytes,
                              self._evicted)

    def close(self) -> None:
        self.flush()

    def _load_existing(self) -> None:
        """Index the objects an earlier process left, oldest first; delete the
        temporary files of writes that never finished."""
        stale = time.time() - STALE_TMP_SECONDS
        for entry in os.scandir(self.directory):
            if entry.name.startswith(".tmp-") and (
                    not self.shared or entry.stat().st_mtime < stale):
                _remove(entry.path)
        self._index_objects(sorted(self._listing()), delete_bad=True)

    def _listing(self) -> list[tuple[float, str, int]]:
        """(mtime, name, size) of the object files in the directory."""
        found = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(SUFFIX) and not entry.name.startswith(".tmp-"):
                try:
                    st = entry.stat()
                except OSError:  # deleted meanwhile
                    continue
                found.append((st.st_mtime, entry.name, st.st_size))
        return found

    def _index_objects(self, found: list[tuple[float, str, int]], delete_bad: bool) -> None:
        """Index these object files (oldest first); ones that do not parse are
        deleted when `delete_bad`, else skipped."""
        for _, name, size in found:
            offsets = _read_index(os.path.join(self.directory, name), size)
            if offsets is None:
                if delete_bad:
                    _remove(os.path.join(self.directory, name))
                continue
            with self._lock:
                if name in self._objects:
                    continue
                for key, (offset, length) in offsets.items():
                    self._index[key] = (name, offset, length)
                self._objects[name] = _Object(name, size, list(offsets))
                self._used += size
        with self._lock:
            self._evict()


def _run_end(plan: list, i: int) -> int:
    """End of the run of entries from `i` stored back to back in one object."""
    name, offset, length = plan[i]
    j = i + 1
    while j < len(plan) and not isinstance(plan[j], bytes) and plan[j][0] == name \
            and plan[j][1] == offset + length:
        _, offset, length = plan[j]
        j += 1
    return j


def _read_index(path: str, size: int) -> dict[bytes, tuple[int, int]] | None:
    """An object file's index, or None when it does not parse or is cut short."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER.size)
            magic, version, count, index_bytes = _HEADER.unpack(head)
            if magic != _MAGIC or version != _VERSION:
                return None
            raw = f.read(index_bytes)
    except (OSError, struct.error):
        return None
    if len(raw) != index_bytes:
        return None
    out, pos = {}, 0
    try:
        for _ in range(count):
            key_len, offset, length = _ENTRY.unpack_from(raw, pos)
            pos += _ENTRY.size
            key = raw[pos:pos + key_len]
            pos += key_len
            if len(key) != key_len or offset + length > size:
                return None
            out[key] = (offset, length)
    except struct.error:
        return None
    return out


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
