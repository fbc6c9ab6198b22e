"""The machine-wide measuring lock: measurements on one device never overlap, across processes too
(an ``fcntl.flock`` on ``felixjax-measure-<uid>-<device>.lock``)."""
from __future__ import annotations

import fcntl
import os
import re
import tempfile
import threading

from codegen.measure_records import _LOCK_TIMEOUT_S


def lock_path(device: str = "cpu", directory: str | os.PathLike | None = None) -> str:
    """The machine-wide measuring lock file of `device` for this user.

    Example:
        >>> lock_path("cpu", "/tmp").startswith("/tmp/felixjax-measure-")
        True
    """
    directory = directory or os.environ.get("FELIXJAX_LOCK_DIR") or tempfile.gettempdir()
    uid = os.getuid() if hasattr(os, "getuid") else 0
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", str(device)) or "cpu"
    return os.path.join(os.fspath(directory), f"felixjax-measure-{uid}-{safe}.lock")


class MeasureLock:
    """A machine-wide exclusive lock for timing kernels on one device: `fcntl.flock` on
    `lock_path(device)`, so two processes (two tuners, a tuner and a benchmark) never time at once.
    The kernel releases it when its holder dies, so a killed tuner never leaves it held. While
    held, the file names the holder's pid (for the message of a waiter that gives up).

    `acquire` blocks (in a helper thread, so it has a timeout) and returns False when `timeout_s`
    passed without the lock; a waiter that gave up never takes the lock afterwards.

    Example:
        >>> lk = MeasureLock("doctest", timeout_s=1.0)
        >>> lk.acquire(), MeasureLock("doctest", timeout_s=0.05).acquire()
        (True, False)
        >>> lk.release()
    """

    def __init__(self, device: str = "cpu", *, directory: str | os.PathLike | None = None,
                 timeout_s: float = _LOCK_TIMEOUT_S) -> None:
        self.path = lock_path(device, directory)
        self.timeout_s = float(timeout_s)
        self._fd: int | None = None

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            return os.open(self.path, flags, 0o600)
        except FileNotFoundError:  # its folder (FELIXJAX_LOCK_DIR) is not there: say which setting
            raise FileNotFoundError(f"measuring lock {self.path}: no folder {os.path.dirname(self.path)} "
                                    "(FELIXJAX_LOCK_DIR names the folder of the machine-wide lock file; unset, the "
                                    "temporary folder)") from None

    def acquire(self, timeout_s: float | None = None) -> bool:
        """Takes the lock; False when it stayed held by another process for `timeout_s`."""
        if self._fd is not None:
            raise RuntimeError(f"measuring lock {self.path} is already held by this object")
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:
            return self._held(fd)
        # Wait in a helper thread: a blocking flock is woken as soon as the holder releases (a
        # polling waiter could lose every race to a holder that measures back to back).
        got, mu, state = threading.Event(), threading.Lock(), {"abandoned": False}

        def wait() -> None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                with mu:
                    state["abandoned"] = True
                os.close(fd)
                got.set()
                return
            with mu:
                if state["abandoned"]:
                    os.close(fd)  # too late: closing releases it at once
                    return
                got.set()

        threading.Thread(target=wait, name="felixjax-measure-lock", daemon=True).start()
        try:
            got.wait(timeout_s)
        except BaseException:  # interrupted while waiting (Ctrl-C, a test's time limit): never keep it afterwards
            with mu:
                if got.is_set() and not state["abandoned"]:
                    os.close(fd)  # the helper took it just now: give it back
                state["abandoned"] = True  # else the helper closes fd if it ever gets the lock
            raise
        with mu:
            if got.is_set() and not state["abandoned"]:
                return self._held(fd)
            state["abandoned"] = True  # the helper closes fd if it ever gets the lock
        return False

    def _held(self, fd: int) -> bool:
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock

    def describe_holder(self) -> str:
        """'process <pid>' as written by the current holder, or 'another process'."""
        try:
            with open(self.path) as f:
                pid = f.read(32).strip()
            return f"process {int(pid)}"
        except (OSError, ValueError):
            return "another process"

    def __enter__(self) -> "MeasureLock":
        if not self.acquire():
            raise TimeoutError(f"measuring lock {self.path} held by {self.describe_holder()} for more than "
                               f"{self.timeout_s:g} s")
        return self

    def __exit__(self, *exc) -> None:
        self.release()
