"""A FUSE filesystem that loses every write not yet fsynced when the power goes (after Jepsen's LazyFS).

    python -m tests.support.lazyfs BACKING MOUNTPOINT      # serves until unmounted or killed

It passes through to a backing directory, except that file data written (and truncations) stay in this
process's memory until the file is fsynced or fdatasynced; only then do they reach the backing file. Reads
see the written data as a page cache would. Metadata (create, mkdir, rename, unlink, rmdir) reaches the backing
directory at once, as on a filesystem that journals metadata synchronously: what a power loss takes is exactly
the unsynced file data. The backing files are not fsynced themselves: the machine does not lose power, only
the "disk" does.

:class:`LazyFs` runs it in a subprocess; :meth:`LazyFs.power_off` SIGKILLs that process (its memory, the
unsynced data, is gone) and unmounts, and :meth:`LazyFs.mount` serves the backing directory again, as it is
after the power loss. fusepy (PyPI) over Debian's libfuse2; mounted by root with mount(2) directly.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


class _Dirty:
    """A file's unsynced data: sorted, non-overlapping extents over the backing content, and its size."""

    def __init__(self, size: int) -> None:
        self.extents: list[tuple[int, bytearray]] = []
        self.size = size
        self.truncated_to: int | None = None  # the smallest unsynced truncation

    def write(self, offset: int, data: bytes) -> None:
        end = offset + len(data)
        merged = bytearray()
        start = offset
        keep: list[tuple[int, bytearray]] = []
        pieces: list[tuple[int, bytearray]] = []
        for s, buf in self.extents:
            e = s + len(buf)
            if e < offset or s > end:  # neither overlapping nor adjacent
                keep.append((s, buf))
            else:
                pieces.append((s, buf))
        if pieces:
            start = min(offset, pieces[0][0])
            stop = max(end, max(s + len(b) for s, b in pieces))
            merged = bytearray(stop - start)
            for s, buf in pieces:
                merged[s - start:s - start + len(buf)] = buf
        else:
            merged = bytearray(len(data))
        merged[offset - start:offset - start + len(data)] = data
        keep.append((start, merged))
        keep.sort(key=lambda x: x[0])
        self.extents = keep
        self.size = max(self.size, end)

    def truncate(self, length: int) -> None:
        out: list[tuple[int, bytearray]] = []
        for s, buf in self.extents:
            if s < length:
                out.append((s, buf[:length - s]))
        self.extents = out
        self.size = length
        self.truncated_to = length if self.truncated_to is None else min(self.truncated_to, length)

    def overlay(self, offset: int, data: bytearray) -> None:
        end = offset + len(data)
        for s, buf in self.extents:
            e = s + len(buf)
            if e <= offset or s >= end:
                continue
            lo, hi = max(s, offset), min(e, end)
            data[lo - offset:hi - offset] = buf[lo - s:hi - s]


def _operations() -> Any:
    from fuse import FuseOSError, Operations

    class Lazy(Operations):
        def __init__(self, root: str) -> None:
            self.root = root
            self.dirty: dict[str, _Dirty] = {}
            self._mutex = threading.Lock()

        def _full(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def __call__(self, op: str, *args: Any) -> Any:
            with self._mutex:
                try:
                    return super().__call__(op, *args)
                except OSError as e:
                    if isinstance(e, FuseOSError):
                        raise
                    raise FuseOSError(e.errno or errno.EIO) from e

        # --- metadata: straight to the backing directory ---------------------------------------------------
        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = os.lstat(self._full(path))
            out = {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime",
                                                 "st_nlink", "st_size", "st_uid")}
            d = self.dirty.get(path)
            if d is not None:
                out["st_size"] = d.size
            return out

        def access(self, path: str, amode: int) -> None:
            if not os.access(self._full(path), amode):
                raise FuseOSError(errno.EACCES)

        def chmod(self, path: str, mode: int) -> None:
            os.chmod(self._full(path), mode)

        def chown(self, path: str, uid: int, gid: int) -> None:
            os.chown(self._full(path), uid, gid)

        def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
            os.utime(self._full(path), times)

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._full(path))]

        def mkdir(self, path: str, mode: int) -> None:
            os.mkdir(self._full(path), mode)

        def rmdir(self, path: str) -> None:
            os.rmdir(self._full(path))

        def unlink(self, path: str) -> None:
            os.unlink(self._full(path))
            self.dirty.pop(path, None)

        def rename(self, old: str, new: str) -> None:
            os.rename(self._full(old), self._full(new))
            self.dirty.pop(new, None)
            for p in [p for p in self.dirty if p == old or p.startswith(old + "/")]:
                self.dirty[new + p[len(old):]] = self.dirty.pop(p)

        def statfs(self, path: str) -> dict[str, Any]:
            st = os.statvfs(self._full(path))
            return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                 "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        # --- file data: held here until fsync ------------------------------------------------------------
        def create(self, path: str, mode: int, fi: Any = None) -> int:
            return os.open(self._full(path), os.O_RDWR | os.O_CREAT, mode)

        def open(self, path: str, flags: int) -> int:
            return os.open(self._full(path), os.O_RDWR if flags & (os.O_WRONLY | os.O_RDWR) else os.O_RDONLY)

        def _dirty(self, path: str, fh: int | None) -> _Dirty:
            d = self.dirty.get(path)
            if d is None:
                size = os.fstat(fh).st_size if fh is not None else os.stat(self._full(path)).st_size
                d = self.dirty[path] = _Dirty(size)
            return d

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            d = self.dirty.get(path)
            if d is None:
                return os.pread(fh, size, offset)
            size = max(0, min(size, d.size - offset))
            data = bytearray(os.pread(fh, size, offset))
            if d.truncated_to is not None and offset + len(data) > d.truncated_to:  # cut, maybe extended again
                keep = max(0, d.truncated_to - offset)
                data[keep:] = bytes(len(data) - keep)
            data += bytes(size - len(data))
            d.overlay(offset, data)
            return bytes(data)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            self._dirty(path, fh).write(offset, data)
            return len(data)

        def truncate(self, path: str, length: int, fh: int | None = None) -> None:
            self._dirty(path, fh).truncate(length)

        def fsync(self, path: str, datasync: int, fh: int) -> None:
            d = self.dirty.pop(path, None)
            if d is None:
                return
            if d.truncated_to is not None:
                os.ftruncate(fh, d.truncated_to)
            for s, buf in d.extents:
                os.pwrite(fh, buf, s)
            os.ftruncate(fh, d.size)

        def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
            return None

        def flush(self, path: str, fh: int) -> None:
            return None

        def release(self, path: str, fh: int) -> None:
            os.close(fh)

    return Lazy


class LazyFs:
    """The filesystem at ``mountpoint`` over ``backing``, served by a subprocess."""

    def __init__(self, backing: Path, mountpoint: Path) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = backing.with_name(backing.name + ".lazyfs.log")

    def mount(self, timeout: float = 20.0) -> LazyFs:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.lazyfs", str(self.backing),
                                          str(self.mountpoint)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 0.02) + 1):
            if self._mounted():
                return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        self.power_off()
        raise RuntimeError(f"lazyfs did not mount {self.mountpoint}: {self.log_path.read_text(errors='replace')}")

    def _mounted(self) -> bool:
        try:
            return _is_fuse(self.mountpoint) and os.path.isdir(self.mountpoint)
        except OSError:
            return False

    def power_off(self) -> None:
        """Lose everything not fsynced: the serving process is killed, the mount removed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        if (os.path.ismount(self.mountpoint) or _is_fuse(self.mountpoint)) and subprocess.run(
                ["umount", str(self.mountpoint)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True, check=False)


def _is_fuse(path: Path) -> bool:
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == str(path) and " - fuse" in line for line in f)
    except OSError:
        return False


def main(argv: list[str]) -> int:
    from fuse import FUSE

    backing, mountpoint = argv
    FUSE(_operations()(os.path.abspath(backing)), mountpoint, foreground=True, nothreads=False,
         fsname="lazyfs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
