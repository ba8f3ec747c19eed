"""``bounded-query-api-proxy``: the bounded-agent API proxy's entry point (spec 15.6).

Usage: ``bounded-query-api-proxy --config PATH --credential-file PATH``.
The configuration (``_config.py``) and the credential file (0400,
``credential.py``) are written by the trusted harness; the credential is
read once, before anything listens. Diagnostics go to stderr as single JSON
lines (``api-proxy-ready`` carries the TCP port); they never contain
request data or the credential.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT), 2 when the proxy refuses
to start (bad configuration or credential file, unusable address or path).
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Sequence
from pathlib import Path

import trio

from bounded_query.broker.apiproxy._config import ConfigError, load_config
from bounded_query.broker.apiproxy.credential import CredentialError, read_credential
from bounded_query.broker.apiproxy.server import ApiProxy, report
from bounded_query.broker.apiproxy.usagelog import UsageLog

__all__ = ["main"]

EXIT_OK = 0
EXIT_REFUSED = 2


async def _serve_until_signalled(proxy: ApiProxy) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(proxy.serve)
            report(
                "api-proxy-ready",
                port=port,
                engine=proxy.config.engine,
                route=proxy.config.route.name,
            )
            async for _ in signals:
                proxy.stop()
                break


def _sole(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def main(argv: Sequence[str] | None = None) -> int:
    """Run the proxy until signalled; return the exit code."""
    parser = argparse.ArgumentParser(prog="bounded-query-api-proxy")
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--credential-file", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        credential = read_credential(args.credential_file)
    except (ConfigError, CredentialError) as exc:
        report("api-proxy-refused", reason="config", detail=str(exc))
        return EXIT_REFUSED
    try:
        usage = UsageLog(config.usage_path)
    except OSError as exc:
        report("api-proxy-refused", reason="usage-log", detail=f"{exc.strerror} ({exc.errno})")
        return EXIT_REFUSED
    try:
        trio.run(_serve_until_signalled, ApiProxy(config, credential, usage))
    except (OSError, BaseExceptionGroup) as raised:
        failure = _sole(raised)
        if not isinstance(failure, OSError):
            raise
        report("api-proxy-refused", reason="os", detail=f"{failure.strerror} ({failure.errno})")
        return EXIT_REFUSED
    finally:
        usage.close()
    report("api-proxy-stopped")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
