"""A small tmpfs to hold a broker's log dir, and a filler file that takes all of its free space (ENOSPC)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path


class Tmpfs:
    """A tmpfs of ``size_mib`` mounted at ``path`` (created), unmounted by :meth:`unmount`."""

    def __init__(self, path: Path, size_mib: int) -> None:
        self.path = path
        self.size_mib = size_mib
        self.filler = path / "filler"
        self.mounted = False

    def mount(self) -> Tmpfs:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mib}m", "tmpfs", str(self.path)],
                       check=True, capture_output=True)
        self.mounted = True
        return self

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self) -> int:
        """Take every free byte with the filler file (allocated at once, then topped up to ENOSPC); its size."""
        with open(self.filler, "ab", buffering=0) as f:
            free = self.free_bytes()
            if free > 1 << 16:
                with contextlib.suppress(OSError):
                    os.posix_fallocate(f.fileno(), f.tell(), free - (1 << 16))
            f.seek(0, os.SEEK_END)
            for _ in range(64):  # the last 64 KiB or so, in 4 KiB writes until the disk refuses
                try:
                    if not f.write(b"\0" * 4096):
                        break
                except OSError:
                    break
        return self.filler.stat().st_size

    def empty(self) -> None:
        """Delete the filler: the space is back."""
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        if not self.mounted:
            return
        if subprocess.run(["umount", str(self.path)], check=False, capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)  # busy: detach
        self.mounted = False
