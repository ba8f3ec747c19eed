"""Reading the provider credential: one 0400 file, read once at start (spec 15.6).

Theory of operation: the real provider credential lives in a file only the
proxy's user can read (mode 0400 or 0600: no group or other bits, owned by
the proxy's effective uid, a regular file reached without following a
symbolic link). It is read once before the proxy listens and kept in memory
as bytes; it never appears in the configuration, argv, the environment, a
log line or a usage record. :func:`check_credential` is the pure content
rule; :func:`read_credential` the file shell.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bounded_query.broker.apiproxy._limits import MAX_CREDENTIAL_BYTES

__all__ = ["CredentialError", "check_credential", "read_credential"]


class CredentialError(ValueError):
    """The credential file is unusable (an operator fault); the message never quotes it."""


def check_credential(raw: bytes) -> bytes:
    """The credential in ``raw`` (one trailing newline allowed).

    Raises:
        CredentialError: empty, too long, or not visible ASCII (it must fit
            in a header value unchanged).
    """
    if raw.endswith(b"\r\n"):
        raw = raw[:-2]
    elif raw.endswith(b"\n"):
        raw = raw[:-1]
    if not 0 < len(raw) <= MAX_CREDENTIAL_BYTES:
        raise CredentialError(f"credential: expected 1-{MAX_CREDENTIAL_BYTES} bytes")
    if any(not 0x21 <= byte <= 0x7E for byte in raw):
        raise CredentialError("credential: expected visible ASCII characters only")
    return raw


def read_credential(path: Path) -> bytes:
    """Read and check the credential file (blocking).

    Raises:
        CredentialError: missing, a symbolic link, not a regular file, not
            owned by us, readable or writable by group or others, or bad content.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise CredentialError(f"credential file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CredentialError(f"credential file {path}: not a regular file")
        if info.st_uid != os.geteuid():
            raise CredentialError(f"credential file {path}: not owned by uid {os.geteuid()}")
        if info.st_mode & 0o077:
            raise CredentialError(
                f"credential file {path}: mode {stat.S_IMODE(info.st_mode):04o};"
                " expected 0400 (no group or other access)"
            )
        raw = os.read(fd, MAX_CREDENTIAL_BYTES + 3)
    finally:
        os.close(fd)
    return check_credential(raw)
