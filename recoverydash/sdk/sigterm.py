"""SIGTERM: write every sender's queue to the disk spool, then hand over to the previous handler.

torchrun ends the other ranks with SIGTERM when one fails; Slurm sends it before SIGKILL; Python's
default action skips ``atexit``. ``install_sigterm_handler`` writes every worker's queue and batch
in flight to the disk spool (``Worker.spool_now``: no network, at most about half a second of
waiting), then hands over to the previous handler (a framework's callable is called; ``SIG_IGN``
stays ignored; ``SIG_DFL`` is restored and SIGTERM raised again, so the exit status stays "killed
by SIGTERM"); the next process of the run sends the spooled events, each with its own attempt.

A Python handler runs only in the main thread between bytecodes: a rank blocked in a collective
in C (``all_reduce`` waiting for a failed rank, where torchrun's SIGTERM finds it) never runs it,
and the handler turns "dies at once" into "lives until torchrun's SIGKILL 30 s later". So by
default a client installs it only for a single-process job (``single_process_job``: world size 1,
not under torchrun), whose SIGTERM then spools the whole queue; a rank of a multi-process job (or
one of unknown world size) keeps SIGTERM's default action, dies at once and loses what the
write-ahead had not written (at most the last ``write_ahead_s`` seconds).
``handle_sigterm=True`` or ``RECOVERYDASH_HANDLE_SIGTERM=1`` installs it for any job, with a
watchdog thread (``_start_sigterm_watchdog``, when no other wakeup fd is set): when the main
thread has not run the handler 0.5 s after SIGTERM (it is in C), the watchdog spools the queues
and ends the process by SIGTERM's default action (exit -15) itself; without the watchdog the
caveat above stands. ``handle_sigterm=False`` or ``RECOVERYDASH_HANDLE_SIGTERM=0`` never installs
it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType
from typing import Any

from recoverydash.sdk.worker import every_worker

_sigterm_previous: Any = None   # the handler ours replaced: SIG_DFL, SIG_IGN or a callable
_sigterm_running = False
_sigterm_installed = False  # ours was installed in this process (a fork's child inherits it)


def single_process_job(world_size: int | None) -> bool:
    """Whether this process is known to be a whole job of one process: ``world_size`` (the
    client's, else ``$WORLD_SIZE``) is 1 and the process was not started by torchrun /
    torchelastic (``$TORCHELASTIC_RUN_ID`` and ``$LOCAL_RANK`` unset). Only then does
    ``Client`` install the SIGTERM handler by default: a rank of a multi-process job is, when
    torchrun sends SIGTERM, most likely blocked in a collective in C (``all_reduce`` waiting for
    the failed rank), where a Python handler never runs, so the handler would keep it alive
    until torchrun's SIGKILL 30 s later instead of letting SIGTERM end it at once."""
    if world_size is None:
        try:
            world_size = int(os.environ.get("WORLD_SIZE", "")) or None
        except ValueError:
            world_size = None
    return world_size == 1 and not os.environ.get("TORCHELASTIC_RUN_ID") and \
        not os.environ.get("LOCAL_RANK")


def install_sigterm_handler() -> bool:
    """Install the SDK's SIGTERM handler once per process (``Client`` calls it by default only
    for a single-process job, ``single_process_job``; ``Client(handle_sigterm=True)`` or
    ``RECOVERYDASH_HANDLE_SIGTERM=1`` for any job, ``False`` / ``0`` never). Caveat: Python runs
    it only in the main thread between bytecodes; a process whose main thread is blocked in C (a
    collective waiting for a failed rank) does not run it, so instead of dying of SIGTERM at once
    it would live until SIGKILL (torchrun's, 30 s later): the watchdog started with it
    (``_start_sigterm_watchdog``) then spools and ends the process by SIGTERM after
    ``WATCHDOG_GRACE_S`` (0.5 s), unless another wakeup fd was set first. torchrun sends SIGTERM
    to the other ranks when one fails, Slurm before its SIGKILL; Python's default action ends the
    process without ``atexit``, so the queued events were lost. On SIGTERM the handler writes
    every worker's queue and batch in flight to the disk spool (``Worker.spool_now``: local
    files, no network, at most about half a second of waiting for the sender), then hands over:
    the previous handler when it was a Python callable (a framework's own: Lightning,
    accelerate, torchelastic) is called with the same arguments; ``SIG_IGN`` keeps the signal
    ignored; ``SIG_DFL`` is restored and SIGTERM raised again, so the process still dies of
    SIGTERM (exit status -15, which torchrun and Slurm read).

    Installs only in the main thread of the main interpreter and only when the current handler
    was set from Python (``signal.getsignal`` is not None), so it can be handed over, and only
    once per process: a handler set after ours (a framework's, which calls the one it replaced)
    is left in place by a later client, since putting ours in front of it again would make the
    two call each other without end. Returns True when the handler is (now or already) in
    place, False when it was not installed."""
    global _sigterm_previous, _sigterm_installed
    try:
        if not hasattr(signal, "SIGTERM") or \
                threading.current_thread() is not threading.main_thread():
            return False
        current = signal.getsignal(signal.SIGTERM)
        if current is _on_sigterm:
            return True
        if current is None or _sigterm_installed:  # set outside Python; or replaced after ours
            return False
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_previous = current
        _sigterm_installed = True
        _start_sigterm_watchdog()
        return True
    except (ValueError, OSError, RuntimeError, AttributeError):
        return False


# The watchdog: Python runs ``_on_sigterm`` only in the main thread between bytecodes, never while
# it is blocked in C (a collective waiting for a failed rank). CPython's C-level signal handler
# writes the signal number to the wakeup fd at once (``signal.set_wakeup_fd``); a daemon thread
# blocked on that pipe sees SIGTERM and, when the Python handler has not started within
# WATCHDOG_GRACE_S, spools the queues itself and, when SIGTERM's disposition before ours was the
# default, restores SIG_DFL process-wide (libc ``signal`` through ctypes: ``signal.signal`` works
# in the main thread only) and raises SIGTERM again: the process dies of SIGTERM as it would have
# without the SDK. Without libc's ``signal`` it ends the process with SIGKILL (exit -9). When the
# disposition before ours was a framework's callable or SIG_IGN, it only spools (those run, or
# not, when the main thread can, as without the SDK). A forked child unsets the inherited wakeup
# fd in its at-fork hook; a SIGTERM it receives before that hook ran (or in a fork made from C
# without Python's at-fork hooks) would reach the parent's watchdog.
WATCHDOG_GRACE_S = 0.5
_spooling = threading.Lock()    # one of the handler and the watchdog spools a SIGTERM
_handler_calls = 0   # times _on_sigterm started in this process (the watchdog stands aside)
_watchdog_fds: tuple[int, int] | None = None  # (read, write) of the wakeup pipe, this process


def _start_sigterm_watchdog() -> bool:
    """Start the SIGTERM watchdog (main thread, once per process, from
    ``install_sigterm_handler``). Only when no wakeup fd was set (asyncio's loop, another
    library's): ``set_wakeup_fd`` returns the previous one, which is then put back and the
    watchdog skipped (the handler alone: it waits for the main thread). Returns True when it
    runs."""
    global _watchdog_fds
    if _watchdog_fds is not None or not hasattr(signal, "set_wakeup_fd"):
        return _watchdog_fds is not None
    r, w = os.pipe()   # non-inheritable: an exec-ed child does not get them
    try:
        os.set_blocking(w, False)
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if previous != -1:
            signal.set_wakeup_fd(previous)
            raise OSError("a wakeup fd is already set")
    except (OSError, ValueError):
        os.close(r)
        os.close(w)
        return False
    _watchdog_fds = (r, w)
    threading.Thread(target=_sigterm_watchdog, args=(r,), name="recoverydash-sigterm-watchdog",
                     daemon=True).start()
    return True


def _sigterm_watchdog(fd: int) -> None:
    """The watchdog thread (see ``_start_sigterm_watchdog``): reads signal numbers from the
    wakeup pipe; other signals are ignored."""
    seen = _handler_calls
    while True:
        try:
            data = os.read(fd, 512)
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue
        except OSError:
            return  # closed (a fork's child closed its copy)
        if not data:
            return
        terms = data.count(int(signal.SIGTERM))
        if not terms:
            continue
        seen += terms
        end = time.monotonic() + WATCHDOG_GRACE_S
        while _handler_calls < seen and time.monotonic() < end:
            time.sleep(0.01)
        if _handler_calls < seen:
            seen = _handler_calls  # (coalesced signals run the handler once)
            _watchdog_takes_over(seen)


def _spool_every_worker() -> None:
    """``spool_now`` of every worker of the process (each never raises): the SIGTERM paths."""
    for w in every_worker():
        w.spool_now()


def _watchdog_takes_over(calls: int) -> None:
    """SIGTERM found the main thread in C: spool every worker's queue from this thread
    (``spool_now`` takes no lock the main thread may hold; a duplicate of the batch in flight is
    counted and ignored by the server), then, when the disposition before ours was SIG_DFL and
    ours is still the handler, end the process by SIGTERM's default action."""
    if not _spooling.acquire(blocking=False):
        return  # the handler is spooling
    try:
        _spool_every_worker()
    finally:
        _spooling.release()
    if _handler_calls > calls or signal.getsignal(signal.SIGTERM) is not _on_sigterm or \
            _sigterm_previous != signal.SIG_DFL:
        return  # a framework's handler (or SIG_IGN) decides; it runs when the main thread can
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        if libc.signal(int(signal.SIGTERM), None) == ctypes.c_void_p(-1).value:  # SIG_ERR
            raise OSError(ctypes.get_errno(), "signal(SIGTERM, SIG_DFL) failed")
        os.kill(os.getpid(), signal.SIGTERM)
    except Exception:  # noqa: BLE001 - no libc signal(): still end the process as SIGTERM would
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(5)  # pragma: no cover - the process is ending


def _watchdog_after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) inherits the wakeup fd, not the thread: its SIGTERM
    would be written to the parent's pipe and wake the parent's watchdog. Unset it (the forking
    thread is the child's main thread) and close the child's copies of the pipe."""
    global _watchdog_fds
    fds, _watchdog_fds = _watchdog_fds, None
    if fds is None:
        return
    try:
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):  # pragma: no cover
        pass
    for fd in fds:
        try:
            os.close(fd)
        except OSError:  # pragma: no cover
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_watchdog_after_fork_in_child)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """The SIGTERM handler (see ``install_sigterm_handler``)."""
    global _sigterm_running, _handler_calls
    _handler_calls += 1
    if not _sigterm_running:  # a second SIGTERM during the first goes straight to the hand-over
        _sigterm_running = True
        locked = _spooling.acquire(timeout=2.0)  # the watchdog may be spooling (then it is done)
        try:
            if locked:
                _spool_every_worker()
        finally:
            if locked:
                _spooling.release()
            _sigterm_running = False
    previous = _sigterm_previous
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # pragma: no cover
        pass
    os.kill(os.getpid(), signal.SIGTERM)


__all__ = ["WATCHDOG_GRACE_S", "install_sigterm_handler", "single_process_job"]
