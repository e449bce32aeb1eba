"""A quicker interpreter exit for labkit's own processes: the CLI and notebook kernels.

CPython's finalization ends with a garbage collection over every object still alive. Once
MLflow's SQL store is imported that pass alone takes most of a second on a 2-core box, paid
at the end of every ``labkit`` command and of every notebook kernel, and a reproduction waits
for each kernel to exit before it starts the next notebook (a kernel that had opened the
store: 1.12 s from shutdown request to exit, 0.11 s with this; ``docs/benchmarks.md``).

``freeze_at_exit()`` registers ``gc.freeze()`` as an exit handler: by the time it runs, every
handler registered after it (MLflow's, the notebook session's, which close and upload the
run) has run, and it moves the survivors into the permanent generation that the last
collection skips. Objects are still freed by reference counting as the modules are cleared;
only cyclic garbage is left to the operating system, which reclaims the whole process anyway.
"""

from __future__ import annotations

import atexit
import gc

_registered = False


def freeze_at_exit() -> None:
    """Skip the final collection at this process's exit (once per process; idempotent)."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True
