"""User-namespace id maps (/proc/<pid>/uid_map, gid_map).

Uploads name owners as the container sees them; fchown needs host ids. Stat
replies go the other way. An id outside every range has no host id: refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from aggapi.status import StatusError

OVERFLOW_ID = 65534  # what the kernel shows for an unmapped id


@dataclass(frozen=True)
class IdMap:
    # (inside, outside, count) lines as the kernel writes them.
    ranges: tuple[tuple[int, int, int], ...]

    @classmethod
    def identity(cls) -> IdMap:
        return cls(((0, 0, 4294967295),))

    @classmethod
    def parse(cls, text: str) -> IdMap:
        ranges = []
        for line in text.splitlines():
            fields = line.split()
            if len(fields) == 3:
                inside, outside, count = (int(f) for f in fields)
                ranges.append((inside, outside, count))
        return cls(tuple(ranges))

    @classmethod
    def read(cls, path: str) -> IdMap:
        """Blocking read of a small procfs file: call from a worker thread."""
        with open(path, encoding="ascii") as f:
            return cls.parse(f.read())

    def to_host(self, cid: int, kind: str = "uid") -> int:
        for inside, outside, count in self.ranges:
            if inside <= cid < inside + count:
                return outside + (cid - inside)
        raise StatusError(400, f"{kind} {cid} is not mapped in the container's user namespace")

    def to_container(self, hid: int) -> int:
        for inside, outside, count in self.ranges:
            if outside <= hid < outside + count:
                return inside + (hid - outside)
        return OVERFLOW_ID
