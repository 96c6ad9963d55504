"""Inter-process locks on files.

``flock`` locks belong to an open file description, so the kernel drops them when
the holding process dies, however it dies: a lock left by a SIGKILLed build is
reclaimed by the next one without any stale-lock heuristics.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import TracebackType

from onnxbuild.errors import CacheError


class FileLock:
    """A lock on ``path`` held between ``acquire`` and ``release``: exclusive, or ``shared``
    (any number of shared holders, no exclusive one: builds share the cache, gc excludes them)."""

    def __init__(self, path: Path, *, what: str = "", timeout: float | None = None, shared: bool = False) -> None:
        self.path = path
        self.shared = shared
        self.what = what or path.name
        self.timeout = timeout
        self._fd: int | None = None
        self.waited = False

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        start = time.monotonic()
        while True:
            if _try_lock(fd, self.shared):
                self._fd = fd
                return
            self.waited = True
            if self.timeout is not None and time.monotonic() - start > self.timeout:
                os.close(fd)
                raise CacheError(
                    f"timed out after {self.timeout:.0f}s waiting for the lock on {self.what} ({self.path}); "
                    "another onnxbuild is still running"
                )
            time.sleep(0.05)

    def try_acquire(self) -> bool:
        """Take the lock if it is free now; never waits. True if taken.

        The runner uses this while its own step processes run: waiting there could
        wait on a lock this very build holds (two recipes sharing a step key).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if _try_lock(fd, self.shared):
            self._fd = fd
            return True
        os.close(fd)
        return False

    def release(self) -> None:
        if self._fd is not None:
            _unlock(self._fd)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


if sys.platform == "win32":  # pragma: no cover - CI runs on Linux
    import msvcrt

    def _try_lock(fd: int, shared: bool = False) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False

    def _unlock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(fd: int, shared: bool = False) -> bool:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
