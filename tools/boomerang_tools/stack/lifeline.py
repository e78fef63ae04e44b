"""Child processes that die with their parent, however the parent dies (SIGKILL included).

On Linux the child asks the kernel, between fork and exec, to send it a signal when its
parent goes away (`prctl(PR_SET_PDEATHSIG)`); the setting survives `exec` of an ordinary
binary, so it covers `boomerang <service>` and `postgres` alike. Elsewhere there is no such
call and a child outlives a parent that was killed with SIGKILL.

The kernel sends the signal when the *thread* that forked the child ends, not the process,
so only children started from the main thread are armed: a worker thread that started one
and then finished would otherwise stop it at once.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Resolved once, here: the forked child must not load libraries before it execs.
_PRCTL = _load_prctl()


def supported() -> bool:
    """Whether children started from this thread die with this process."""
    return _PRCTL is not None and threading.current_thread() is threading.main_thread()


def die_with_parent(signum: int) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `signum` when this process dies.

    None where that is not supported (see the module docstring). Runs in the child after
    Popen's `user=`/`group=` changes, which would otherwise clear the setting.
    """
    if not supported():
        return None
    prctl = _PRCTL
    assert prctl is not None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm
