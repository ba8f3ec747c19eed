"""Realistic agent questions on realistic repositories, host vs broker (issue 12).

    flock /tmp/bq-engine.lock python3 tests/bench/bench_realistic.py
        [--shapes s200,m2k,l5k,x20k] [--runtimes docker,gvisor] [--trials 3]
        [--questions trivial,files,...] [--cache /var/tmp/bq-bench-realistic]

Repositories (generated once with ``git fast-import``, deterministic, cached
under ``--cache`` keyed by shape and generator version, so reruns start at
once): ``s200`` about 200 files and 6,000 commits; ``m2k`` 2,000 files and
60,000 commits with about 350 MB of history; ``l5k`` 5,000 files and 20,000
commits; ``x20k`` a 20,000-file, 200 MB tree. File kinds, imports, symbols
and sizes look like a Python project's. Each generated repository is then
staged with the harness's own steps (``harness/staging/seeds.py``: ``scrub`` writes
the seed's minimal ``.git/config``, ``make_read_only`` strips write bits), so
a change of the seed configuration gives a new cached seed.

Questions (an agent's usual whole-tree ones, each a script with a finite
schema): a trivial one, file counts, symbol search, line counts, a
clean-tree ``git status``, ``git log`` counts, ``git grep``, the largest
file, imports, ``git ls-files``, a write into the private copy (new file and
an edit, then ``git status`` must show both) and an edit that keeps the size
and restores the mtime (``mtime-restored``: the blind spot of the seed's
``core.checkStat = minimal``, harness/staging/seeds.py; its ``ok`` column tells
whether git saw the edit, as it does on the host).

Each question runs on the host (``python3 -I -S`` on a writable checkout of
the same repository, warm page cache; median of ``--trials``) and through
the broker's runner path (``DockerRunner`` exactly as ``broker/service.py``
drives it: fresh workspace, ``run``, the broker's result reader and strict
output check, workspace removal; the seed's view layer is warmed first, as
the broker does at start-up). Broker time is that whole span; its bucket is
``broker/timing.py``'s :func:`choose_boundary`. An answer is *promoted* when
its bucket is past max(1 s, the bucket of the host time). The answers of
host and broker are compared (``ok``). Tables only, never assertions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bounded_query.broker.protocol import check_output, parse_schema, policy
from bounded_query.broker.runner import Invocation, RunnerSettings
from bounded_query.broker.timing import BOUNDARIES_S, choose_boundary
from bounded_query.broker.workspace import remove_tree
from bounded_query.harness.staging import seeds as staging
from bounded_query.sandbox import DockerRunner, RunnerOptions
from bounded_query.sandbox import docker_runner as docker_runner_module
from bounded_query.sandbox import spec as spec_module

IMAGE = "bounded-query-python:latest"
MEMORY = 1024**3
TIMEOUT_S = 120
#: Bump when the generated content changes (part of the cache key).
GEN_VERSION = 1
BUCKET_NAMES = ("10ms", "100ms", "1s", "10s", "60s", "600s")
GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "LANG": "C.UTF-8",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}
#: What the query container gets (sandbox/spec.py CONTAINER_ENV), for host runs.
HOST_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_CONFIG_NOSYSTEM": "1",
}
REPO_LINE = 'REPO = "/query/repo"\n'


@dataclass(frozen=True, slots=True)
class Shape:
    """A generated repository: tree size, history length and bytes per rewrite."""

    files: int
    commits: int
    #: average bytes of a file in the first commit
    file_bytes: int
    #: bytes of each later rewrite (one file per commit)
    rewrite_bytes: int


SHAPES = {
    "s200": Shape(files=200, commits=6_000, file_bytes=6_000, rewrite_bytes=4_000),
    "m2k": Shape(files=2_000, commits=60_000, file_bytes=8_000, rewrite_bytes=15_000),
    "l5k": Shape(files=5_000, commits=20_000, file_bytes=8_000, rewrite_bytes=8_000),
    "x20k": Shape(files=20_000, commits=200, file_bytes=10_000, rewrite_bytes=10_000),
}

# -- repository generation ----------------------------------------------------

_WORD_TEXT = (
    "request response handler client server config cache value index table "
    "buffer stream token parser schema record ledger budget entry state event "
    "queue worker task result error status commit branch object tree blob path "
    "name size count limit offset window frame packet channel socket session "
    "user group mode flag option setting update delete create insert select"
)
_WORDS = _WORD_TEXT.split()
_MODULE_TEXT = (
    "os sys re json time typing pathlib dataclasses collections itertools "
    "functools logging subprocess hashlib base64 struct socket threading asyncio "
    "contextlib argparse tempfile shutil math random enum abc io csv sqlite3"
)
_MODULES = _MODULE_TEXT.split()
_PACKAGES = ("core", "api", "util", "storage", "net", "cli", "model", "views")
_EXTENSIONS = (".py",) * 12 + (".md", ".md", ".js", ".js", ".txt", ".json", ".toml", ".cfg")


def _line_pool(rng: random.Random, count: int) -> list[str]:
    lines = []
    for _ in range(count):
        kind = rng.random()
        a, b, c = rng.choice(_WORDS), rng.choice(_WORDS), rng.choice(_WORDS)
        tag = f"{rng.getrandbits(48):012x}"
        if kind < 0.4:
            lines.append(f"    {a}_{b} = {c}_{rng.choice(_WORDS)}({a}, {rng.randrange(1000)})")
        elif kind < 0.6:
            lines.append(f"    # {a} {b} {c}: {tag}")
        elif kind < 0.8:
            lines.append(f'    if {a}.{b} is None:\n        raise ValueError("{c} {tag}")')
        else:
            lines.append(f"def {a}_{b}_{tag[:6]}({c}, {rng.choice(_WORDS)}=None):")
    return lines


def _paths(rng: random.Random, count: int) -> list[str]:
    per_dir = 40
    dirs = max(1, count // per_dir)
    paths: set[str] = set()
    while len(paths) < count:
        d = rng.randrange(dirs)
        pkg = _PACKAGES[d % len(_PACKAGES)]
        ext = rng.choice(_EXTENSIONS)
        paths.add(f"src/{pkg}/m{d:04d}/{rng.choice(_WORDS)}_{len(paths):05d}{ext}")
    return sorted(paths)


def _content(rng: random.Random, pool: list[str], path: str, size: int) -> bytes:
    out: list[str] = []
    if path.endswith(".py"):
        for module in rng.sample(_MODULES, rng.randrange(2, 9)):
            out.append(f"import {module}")
        out.append(f"from {rng.choice(_PACKAGES)}.{rng.choice(_WORDS)} import {rng.choice(_WORDS)}")
        if rng.random() < 0.05:
            out.append("def handle_request(request, timeout=None):")
    total = sum(len(s) + 1 for s in out)
    while total < size:
        line = rng.choice(pool)
        out.append(line)
        total += len(line) + 1
    return ("\n".join(out) + "\n").encode()


def _fast_import_stream(shape: Shape, rng: random.Random) -> Iterator[bytes]:
    pool = _line_pool(rng, 40_000)
    paths = _paths(rng, shape.files)
    when = 1_420_070_400  # 2015-01-01
    who = b"Dev Eloper <dev@example.invalid>"

    def commit(mark: int, message: str, changes: list[tuple[str, bytes]]) -> bytes:
        nonlocal when
        when += 3_600
        parts = [
            b"commit refs/heads/main\n",
            b"mark :%d\n" % mark,
            b"committer %s %d +0000\n" % (who, when),
            b"data %d\n%s\n" % (len(message), message.encode()),
        ]
        if mark > 1:
            parts.append(b"from :%d\n" % (mark - 1))
        for path, data in changes:
            parts.append(b"M 100644 inline %s\ndata %d\n%s\n" % (path.encode(), len(data), data))
        return b"".join(parts)

    first = []
    for path in paths:
        size = int(shape.file_bytes * rng.lognormvariate(0, 0.8) / 1.38)
        first.append((path, _content(rng, pool, path, max(64, size))))
    # one large generated file, as real repositories have (lock files, data)
    first.append(("data/fixtures.json", _content(rng, pool, "x.json", 2_000_000)))
    first.append(("README.md", b"# generated\n\nA repository shaped like a real one.\n"))
    yield commit(1, "initial import", first)
    for mark in range(2, shape.commits + 1):
        path = rng.choice(paths)
        data = _content(rng, pool, path, int(shape.rewrite_bytes * rng.uniform(0.5, 1.5)))
        yield commit(mark, f"update {path.rsplit('/', 1)[-1]}", [(path, data)])


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, env=GIT_ENV, input=stdin, capture_output=True, check=True
    )
    return done.stdout.decode()


def generate(shape_name: str, cache: Path) -> Path:
    """The writable, checked-out source repository of one shape (cached)."""
    shape = SHAPES[shape_name]
    key = hashlib.sha256(repr((shape, GEN_VERSION)).encode()).hexdigest()[:8]
    src = cache / f"{shape_name}-v{GEN_VERSION}-{key}" / "src"
    if (src / ".git" / "bq-generated").exists():
        return src
    shutil.rmtree(src.parent, ignore_errors=True)
    src.mkdir(parents=True)
    started = time.perf_counter()
    _git(src, "-c", "init.templateDir=", "init", "-q", "-b", "main")
    rng = random.Random(f"bq-realistic-{shape_name}-{GEN_VERSION}")
    proc = subprocess.Popen(
        ["git", "fast-import", "--quiet", "--done"],
        cwd=src,
        env=GIT_ENV,
        stdin=subprocess.PIPE,
    )
    assert proc.stdin is not None
    for chunk in _fast_import_stream(shape, rng):
        proc.stdin.write(chunk)
    proc.stdin.write(b"done\n")
    proc.stdin.close()
    if proc.wait() != 0:
        raise RuntimeError(f"git fast-import failed for {shape_name}")
    _git(src, "-c", "checkout.workers=0", "reset", "-q", "--hard", "main")
    (src / ".git" / "bq-generated").write_text(f"{time.perf_counter() - started:.1f}\n")
    return src


def seed_key() -> str:
    """What the staged seed depends on besides the shape: the seed config."""
    text = staging._MINIMAL_CONFIG + str(GEN_VERSION)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def stage(shape_name: str, cache: Path) -> tuple[Path, Path]:
    """(writable source checkout, staged read-only seed) of one shape (cached)."""
    src = generate(shape_name, cache)
    seed = src.parent / f"seed-{seed_key()}"
    if (seed / ".git").is_dir():
        return src, seed
    for old in src.parent.glob("seed-*"):
        for dirpath, _dirs, _files in os.walk(old):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(old)
    tmp = src.parent / "seed.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(["cp", "-a", str(src), str(tmp)], check=True)
    (tmp / ".git" / "bq-generated").unlink()
    home = Path(tempfile.mkdtemp(prefix="bq-stage-home-"))
    try:
        staging.reject_external_references(tmp)
        staging.scrub(tmp, home)
        staging.make_read_only(tmp)
    finally:
        shutil.rmtree(home)
    tmp.rename(seed)
    return src, seed


def describe(src: Path) -> str:
    files = int(_git(src, "ls-files", "-z").count("\0"))
    commits = int(_git(src, "rev-list", "--count", "HEAD"))
    pack = sum(p.stat().st_size for p in (src / ".git" / "objects" / "pack").glob("*.pack"))
    tree = 0
    for d, dirs, fs in os.walk(src):
        if ".git" in dirs:
            dirs.remove(".git")  # the history is the pack, counted above
        tree += sum(os.lstat(os.path.join(d, f)).st_size for f in fs)
    return f"{files} files, {commits} commits, pack {pack / 1e6:.0f} MB, tree {tree / 1e6:.0f} MB"


# -- questions ------------------------------------------------------------------

_PRELUDE = REPO_LINE + (
    "import os, re, subprocess\n"
    "def out(v):\n"
    "    open('/query/out', 'w').write(v)\n"
    "def git(*a):\n"
    "    return subprocess.run(['git', '-C', REPO, *a], capture_output=True, check=True,"
    " text=True).stdout\n"
    "def walk():\n"
    "    for d, dirs, files in os.walk(REPO):\n"
    "        if '.git' in dirs: dirs.remove('.git')\n"
    "        for f in files: yield os.path.join(d, f)\n"
)
_INT = {"type": "integer", "minimum": 0, "maximum": 2**53 - 1}
_BOOL = {"type": "boolean"}
QUESTIONS: dict[str, tuple[str, object]] = {
    "trivial": ("out('true')\n", _BOOL),
    "py-files": ("out(str(sum(1 for p in walk() if p.endswith('.py'))))\n", _INT),
    "symbol": (
        "n = 0\n"
        "for p in walk():\n"
        "    if p.endswith('.py') and b'def handle_request(' in open(p, 'rb').read(): n += 1\n"
        "out(str(n))\n",
        _INT,
    ),
    "py-lines": (
        "out(str(sum(open(p, 'rb').read().count(b'\\n') for p in walk() if p.endswith('.py'))))\n",
        _INT,
    ),
    "git-status": ("out('true' if git('status', '--porcelain') == '' else 'false')\n", _BOOL),
    "log-count": ("out(git('rev-list', '--count', 'HEAD').strip())\n", _INT),
    "log-path": ("out(str(len(git('log', '--format=%h', '--', 'README.md').split())))\n", _INT),
    "git-grep": (
        "out(str(len(git('grep', '-l', 'handle_request', '--', '*.py').split())))\n",
        _INT,
    ),
    "largest": ("out(str(max(os.lstat(p).st_size for p in walk())))\n", _INT),
    "imports": (
        "mods = set()\n"
        "rx = re.compile(rb'^(?:import|from) ([A-Za-z_][\\w.]*)', re.M)\n"
        "for p in walk():\n"
        "    if p.endswith('.py'): mods.update(rx.findall(open(p, 'rb').read()))\n"
        "out(str(len(mods)))\n",
        _INT,
    ),
    "ls-files": ("out(str(git('ls-files', '-z').count(chr(0))))\n", _INT),
    "write": (
        "open(os.path.join(REPO, 'NOTES.bq'), 'w').write('note\\n')\n"
        "with open(os.path.join(REPO, 'README.md'), 'a') as f: f.write('edited\\n')\n"
        "s = git('status', '--porcelain')\n"
        "out('true' if ' M README.md' in s and '?? NOTES.bq' in s else 'false')\n",
        _BOOL,
    ),
    "mtime-restored": (
        # an edit git's minimal stat check cannot see (same size, same mtime
        # second as the original); the host's git sees it
        "p = os.path.join(REPO, 'README.md')\n"
        "st = os.stat(p)\n"
        "data = open(p, 'rb').read()\n"
        "open(p, 'wb').write(data.upper() if data.upper() != data else data.lower())\n"
        "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\n"
        "out('true' if ' M README.md' in git('status', '--porcelain') else 'false')\n",
        _BOOL,
    ),
}


def host_script(question: str, src: Path) -> str:
    body = _PRELUDE.replace(REPO_LINE, f"REPO = {str(src)!r}\n") + QUESTIONS[question][0]
    return body.replace("'/query/out'", "os.environ['BQ_OUT']")


def query_script(question: str) -> bytes:
    return (_PRELUDE + QUESTIONS[question][0]).encode()


def restore(src: Path) -> None:
    """Undo a host run's writes (the write questions) in the source checkout."""
    _git(src, "checkout", "-q", "--", "README.md")
    (src / "NOTES.bq").unlink(missing_ok=True)


def run_host(question: str, src: Path, trials: int) -> tuple[float, str]:
    """Median seconds of the script on the host (after one warm-up) and its answer."""
    script = host_script(question, src)
    times, answer = [], ""
    out_dir = Path(tempfile.mkdtemp(prefix="bq-host-"))
    try:
        for i in range(trials + 1):
            out = out_dir / f"out{i}"
            env = dict(HOST_ENV, BQ_OUT=str(out))
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-I", "-S", "-c", script], env=env, check=True, cwd=out_dir
            )
            elapsed = time.perf_counter() - started
            restore(src)
            answer = out.read_text()
            if i:
                times.append(elapsed)
    finally:
        shutil.rmtree(out_dir)
    return statistics.median(times), answer


async def run_broker_once(
    runner: DockerRunner, seed: Path, work: Path, question: str
) -> tuple[float, str | None, str | None]:
    """One invocation the way broker/service.py runs it: (seconds, answer, failure)."""
    schema = parse_schema(QUESTIONS[question][1])
    started = time.perf_counter()
    invocation_id = secrets.token_hex(16)
    workspace = work / invocation_id
    await trio.to_thread.run_sync(lambda: workspace.mkdir(mode=0o700))
    invocation = Invocation(
        runner.settings.run_id, invocation_id, seed, workspace, query_script(question)
    )
    report = await runner.run(invocation)
    canonical = None
    if report.failure is None:
        raw = report.result
        canonical = None if raw is None else check_output(raw, schema)
    await trio.to_thread.run_sync(remove_tree, workspace)
    return time.perf_counter() - started, canonical, report.failure


async def run_broker(
    runtime: str, seed: Path, work: Path, questions: list[str], trials: int, cold: bool = False
) -> dict[str, tuple[float, str | None, str | None, float]]:
    """Per question: (median seconds, last answer, a failure, one-off first query).

    As the broker does, the seed's next container is prepared after each
    answer and at start-up (issue 20; outside the timed span), unless
    ``cold``: then every query starts its own container.
    """
    cfg = RunnerSettings(runtime, secrets.token_hex(16), IMAGE, TIMEOUT_S, MEMORY)
    runner = DockerRunner(cfg, options=RunnerOptions(prepared=not cold))
    results = {}
    try:
        await runner.reconcile()
        warm_started = time.perf_counter()
        await runner.warm([seed])
        await runner.prepare(seed, work)
        print(f"# {runtime}: warm {time.perf_counter() - warm_started:.1f} s", file=sys.stderr)
        for question in questions:
            times, answer, failure = [], None, None
            first = 0.0
            for i in range(trials):
                elapsed, got, failed = await run_broker_once(runner, seed, work, question)
                await runner.prepare(seed, work)  # the broker's idle hook
                times.append(elapsed)
                answer, failure = got, failure or failed
                first = first or elapsed
                del i
            results[question] = (statistics.median(times), answer, failure, first)
            print(f"# {runtime} {question}: {times}", file=sys.stderr, flush=True)
    finally:
        with trio.CancelScope(shield=True):
            await runner.reconcile()
        runner.close()
    return results


def bucket(seconds: float) -> int:
    try:
        return choose_boundary(seconds, BOUNDARIES_S)
    except Exception:
        return len(BOUNDARIES_S)


def bucket_name(index: int) -> str:
    return BUCKET_NAMES[index] if index < len(BUCKET_NAMES) else "overflow"


#: Index of the 1 s boundary: nothing below it counts as promoted.
ONE_SECOND = BOUNDARIES_S.index(1.0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/var/tmp/bq-bench-realistic"))
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--runtimes", default="docker,gvisor")
    parser.add_argument("--questions", default=",".join(QUESTIONS))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument(
        "--oci-runtime",
        action="append",
        default=[],
        metavar="RUNTIME=OCI",
        help="run RUNTIME's queries on another registered OCI runtime (e.g. gvisor=runsc-x, "
        "to compare runsc flags; the seccomp variant stays RUNTIME's)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="no prepared containers: every query starts its own (the pre-issue-20 path)",
    )
    parser.add_argument(
        "--show", type=Path, nargs="+", help="print one table from earlier --json files (no run)"
    )
    args = parser.parse_args(argv)
    if args.show:
        saved = [row for path in args.show for row in json.loads(path.read_text())]
        shown = [r for r in args.runtimes.split(",") if all(r in row for row in saved)]
        print_table(saved, shown, args.trials)
        return 0
    if args.oci_runtime:
        overrides = dict(item.split("=", 1) for item in args.oci_runtime)
        # Both modules bound the policy's table at import: patch both copies.
        patched = {**policy.OCI_RUNTIMES, **overrides}
        for module in (spec_module, docker_runner_module):
            module.__dict__["OCI_RUNTIMES"] = patched
    shapes = args.shapes.split(",")
    runtimes = args.runtimes.split(",")
    questions = args.questions.split(",")
    rows: list[dict[str, object]] = []
    for shape in shapes:
        src, seed = stage(shape, args.cache)
        print(f"# {shape}: {describe(src)}", file=sys.stderr, flush=True)
        host = {q: run_host(q, src, args.trials) for q in questions}
        broker = {}
        work = Path(tempfile.mkdtemp(prefix="bq-bench-work-"))
        try:
            for runtime in runtimes:
                broker[runtime] = trio.run(
                    run_broker, runtime, seed, work, questions, args.trials, args.cold
                )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for q in questions:
            row: dict[str, object] = {
                "shape": shape,
                "question": q,
                "host": host[q][0],
                "host_answer": host[q][1],
            }
            host_bucket = max(ONE_SECOND, bucket(host[q][0]))
            for runtime in runtimes:
                seconds, answer, failure, first = broker[runtime][q]
                b = bucket(seconds)
                row[runtime] = {
                    "seconds": seconds,
                    "first": first,
                    "bucket": bucket_name(b),
                    "promoted": b > host_bucket,
                    "ok": failure is None and answer == host[q][1],
                    "failure": failure,
                    "answer": answer,
                }
            rows.append(row)
        print(f"# done {shape}", file=sys.stderr, flush=True)
    print_table(rows, runtimes, args.trials)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def print_table(rows: list[dict[str, object]], runtimes: list[str], trials: int) -> None:
    print(
        f"\nMedian seconds of {trials} trials; broker = workspace + run + result check + "
        "removal; promoted = bucket past max(1 s, host bucket); ok = same answer as the host\n"
    )
    head = "| shape | question | host |"
    rule = "|---|---|---|"
    for runtime in runtimes:
        head += f" {runtime} | bucket | promoted | ok |"
        rule += "---|---|---|---|"
    print(head)
    print(rule)
    for row in rows:
        line = f"| {row['shape']} | {row['question']} | {row['host']:.3f} |"
        for runtime in runtimes:
            cell = row[runtime]
            assert isinstance(cell, dict)
            line += (
                f" {cell['seconds']:.3f} | {cell['bucket']} | "
                f"{'PROMOTED' if cell['promoted'] else 'no'} | "
                f"{'ok' if cell['ok'] else 'WRONG ' + str(cell['failure'] or '')} |"
            )
        print(line)
    print()
    for runtime in runtimes:
        cells = [row[runtime] for row in rows]
        kept = sum(1 for c in cells if isinstance(c, dict) and not c["promoted"])
        status = [
            row[runtime]
            for row in rows
            if row["question"] == "git-status" and isinstance(row[runtime], dict)
        ]
        status_1s = sum(
            1 for c in status if isinstance(c, dict) and c["bucket"] in BUCKET_NAMES[:3]
        )
        trivial = [
            row[runtime]
            for row in rows
            if row["question"] == "trivial" and isinstance(row[runtime], dict)
        ]
        trivial_1s = sum(
            1 for c in trivial if isinstance(c, dict) and c["bucket"] in BUCKET_NAMES[:3]
        )
        wrong = sum(1 for c in cells if isinstance(c, dict) and not c["ok"])
        print(
            f"{runtime}: {kept}/{len(cells)} ({kept / max(1, len(cells)):.0%}) without promotion; "
            f"clean git status in 1 s bucket {status_1s}/{len(status)}; "
            f"trivial in 1 s bucket {trivial_1s}/{len(trivial)}; wrong answers {wrong}"
        )
    print(json.dumps({"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
