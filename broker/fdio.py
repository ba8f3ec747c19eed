"""Writing a whole buffer to a file descriptor.

``os.write`` may write fewer bytes than asked (a signal, a pipe or a full
disk); every writer of ours that must not leave a partial record (the
journal, the audit log, a workspace's script and result files, the agent's
relayed output) loops here until the buffer is gone.
"""

from __future__ import annotations

import os

__all__ = ["write_all"]


def write_all(fd: int, data: bytes | memoryview, *, retry_blocking: bool = False) -> None:
    """Write all of ``data`` to ``fd``.

    With ``retry_blocking`` a non-blocking descriptor that is momentarily
    full (``BlockingIOError``) is retried instead of failing.

    Raises:
        OSError: the write failed; some prefix of ``data`` may be written.
    """
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            if not retry_blocking:
                raise
            continue
        view = view[written:]
