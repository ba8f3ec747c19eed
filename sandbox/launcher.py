"""In-container launcher of a prepared query container (spec 14.7).

Theory of operation: a prepared container is created and started *before*
its request exists, so the expensive part of a launch (runtime start,
mounts, the interpreter's start-up) is off the answer's critical path. This
program is its first and only process until the request arrives; it runs
no agent code before that. It blocks reading its standard input (the
runner attaches to the container's stdin when the request comes and sends
the script's bytes, then closes it); on EOF it writes the script read-only
into its own tmpfs at :data:`SCRIPT`, lowers RLIMIT_FSIZE and runs
``python3 SCRIPT`` with cwd ``/query`` and stdin ``/dev/null``, exactly like
the image's entrypoint runs a cold query (``sandbox/image/entrypoint.py``).
The copy-on-write view of the seed is already mounted at ``/query/repo``.

The runner passes this file's source as ``python3 -I -S -c SOURCE MAX``
(``prepared_spec`` in :mod:`.spec`), so it needs no image change and no host
path: what runs is the broker's own trusted code, never a request's. It must
stay standard-library only and never import the package it lives in.

Exit status: the script's own status; 128+N when it died from signal N;
:data:`DELIVERY_FAILED` when no complete script arrived (stdin closed
before EOF was clean, an empty or oversize script): fail closed, nothing runs.
"""

import os
import resource
import subprocess
import sys

#: Where the delivered script is written: the path a cold container binds it
#: at, on a small tmpfs of the prepared container's own (``SCRIPT_DIR``).
SCRIPT_DIR = "/awf"
SCRIPT = SCRIPT_DIR + "/query-script.py"
QUERY = "/query"
#: Exit status when the script could not be delivered (EX_DATAERR).
DELIVERY_FAILED = 65
#: Per-file size limit for the script itself (as in the image's entrypoint).
SCRIPT_FSIZE_BYTES = 64 * 1024 * 1024


def read_script(limit: int) -> bytes | None:
    """Read stdin to EOF; None when it holds nothing or more than ``limit`` bytes."""
    chunks = []
    total = 0
    while True:
        try:
            chunk = os.read(0, 65536)
        except OSError:
            return None
        if not chunk:
            break
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks) if total else None


def main(argv: list[str]) -> int:
    """Wait for the script, then run it; return the exit status."""
    script = read_script(int(argv[0]))
    if script is None:
        return DELIVERY_FAILED
    fd = os.open(SCRIPT, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
    try:
        view = memoryview(script)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit = SCRIPT_FSIZE_BYTES if hard == resource.RLIM_INFINITY else min(hard, SCRIPT_FSIZE_BYTES)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    os.chdir(QUERY)
    status = subprocess.call(["python3", SCRIPT], stdin=subprocess.DEVNULL, close_fds=True)
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
