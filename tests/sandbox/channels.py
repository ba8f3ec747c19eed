"""Cross-invocation channel experiments (issue 9): encoder and decoder queries, decoding.

An *encoder* query (think: on a metered repository) gets a secret ``s`` in
``[0, 2**BITS)`` and modulates every piece of shared state we know of in
proportion to it; the next *decoder* query (think: on an unmetered public
repository) records what it can observe. Both run through the real
:class:`~bounded_query.sandbox.DockerRunner`, one after the other, exactly as
the broker runs invocations.

Decoding is what an attacker who knows the scheme would do: for a magnitude
feature ``f``, ``s_hat = round((f_t - f_{t-1} - c) / step)`` where ``c`` is
the median offset over all trials (the attacker calibrates it) and
``f_{t-1}`` is the previous decoder's value; for the page-cache timing
features, bit ``i`` is "fast" (resident) against the median time. A channel
is at chance when the decoded bits match the secret bits no more often than
coin flips do: with ``n`` secret bits, chance is ``n/2`` with standard
deviation ``sqrt(n)/2``; :func:`at_chance` allows :data:`CHANCE_SIGMAS`.
"Bits recovered" is the fraction of correct bits turned into capacity per
trial (``BITS * (1 - H(p_err))``).

The secret is passed to the encoder inside its script text, as an agent
would choose it; nothing else differs between trials.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence

#: Secret bits per trial.
BITS = 4
#: Per unit of secret: files created and deleted, pipes, dentries, forks, KiB.
STEP_FILES = 64
STEP_PIPES = 1024
STEP_DENTRIES = 2000
STEP_FORKS = 4
STEP_KIB = 512
#: Image files nothing else reads (perl's Encode tables): one per secret bit
#: for the page-cache channel (read by the encoder when the bit is set).
CACHE_FILES = tuple(
    f"/usr/lib/x86_64-linux-gnu/perl/5.36.0/auto/Encode/{name}/{name}.so"
    for name in ("JP", "KR", "CN", "TW")
)
#: Allowed excess of correct bits over chance, in standard deviations. The
#: decoder keeps the best of up to 8 unit sizes and of every feature of a
#: channel (at most 64 tries): the maximum of 64 chance scores exceeds 4.5
#: standard deviations with probability about 64 * 3.4e-6 = 2e-4, while an
#: open channel decodes nearly every bit (16+ standard deviations above).
CHANCE_SIGMAS = 4.5

ENCODER = r"""
import os, ctypes
S = __SECRET__
for d in ("/query/repo", "/query", "/tmp", "/dev/shm"):
    for i in range(S * __STEP_FILES__):
        p = f"{d}/e{i}"
        open(p, "w").close()
        os.unlink(p)
with open("/query/repo/blob", "wb") as fh:
    fh.write(b"x" * 1024 * __STEP_KIB__ * S)
with open("/tmp/blob", "wb") as fh:
    fh.write(b"x" * 1024 * __STEP_KIB__ * S)
for i in range(S * __STEP_PIPES__):
    r, w = os.pipe(); os.close(r); os.close(w)
for i in range(S * __STEP_DENTRIES__):
    try:
        os.stat(f"/usr/share/nonexistent-{S}-{i}")
    except OSError:
        pass
for i in range(S * __STEP_FORKS__):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
for bit, path in enumerate(__CACHE_FILES__):
    if S >> bit & 1:
        with open(path, "rb") as fh:
            while fh.read(1 << 20):
                pass
open("/query/out", "w").write("{}")
"""

DECODER = r"""
import json, os, socket, time
obs = {}
# When the container was prepared (issue 20), read before this script
# touches anything: the launcher's start against the boot clock, and the
# mount time of the untouched /dev/shm tmpfs and of the result file.
try:
    _stat = open("/proc/1/stat").read().rsplit(")", 1)[1].split()
    _start = int(_stat[19]) / os.sysconf("SC_CLK_TCK")
    obs["age_pid1"] = time.clock_gettime(time.CLOCK_BOOTTIME) - _start
except (OSError, ValueError, IndexError):
    obs["age_pid1"] = -1.0
obs["age_shm"] = (time.time_ns() - os.stat("/dev/shm").st_mtime_ns) / 1e9
obs["age_out"] = (time.time_ns() - os.stat("/query/out").st_ctime_ns) / 1e9
def ino(path):
    open(path, "w").close()
    value = os.stat(path).st_ino
    os.unlink(path)
    return value
obs["ino_out"] = os.stat("/query/out").st_ino
obs["ino_script"] = os.stat("/awf/query-script.py").st_ino
obs["ino_repo_dir"] = os.stat("/query/repo").st_ino
for name, d in (("repo", "/query/repo"), ("query", "/query"), ("tmp", "/tmp"), ("shm", "/dev/shm")):
    obs["ino_new_" + name] = ino(d + "/d")
    v = os.statvfs(d)
    obs["bfree_" + name] = v.f_bfree
    obs["ffree_" + name] = v.f_ffree
r, w = os.pipe()
obs["ino_pipe"] = os.fstat(r).st_ino
a, b = socket.socketpair()
obs["ino_socket"] = os.fstat(a.fileno()).st_ino
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
obs["pid_child"] = pid
def first_number(path, field=0):
    try:
        text = open(path).read().split()
        return float(text[field]) if len(text) > field else -1.0
    except (OSError, ValueError):
        return -1.0
obs["proc_dentry_state"] = first_number("/proc/sys/fs/dentry-state")
obs["proc_dentry_negative"] = first_number("/proc/sys/fs/dentry-state", 4)
obs["proc_inode_nr"] = first_number("/proc/sys/fs/inode-nr")
obs["proc_file_nr"] = first_number("/proc/sys/fs/file-nr")
obs["proc_memfree"] = first_number("/proc/meminfo", 4)
obs["proc_procs_running"] = first_number("/proc/stat", 1)
for bit, path in enumerate(__CACHE_FILES__):
    t0 = time.perf_counter_ns()
    with open(path, "rb") as fh:
        while fh.read(1 << 20):
            pass
    obs[f"cache_ns_{bit}"] = time.perf_counter_ns() - t0
open("/query/out", "w").write(json.dumps(obs))
"""


def _fill(template: str, **values: object) -> str:
    text = template
    for key, value in values.items():
        text = text.replace(f"__{key}__", repr(value) if not isinstance(value, int) else str(value))
    return text


def encoder(secret: int) -> str:
    """The encoder script for ``secret``."""
    if not 0 <= secret < 2**BITS:
        raise ValueError(secret)
    return _fill(
        ENCODER,
        SECRET=secret,
        STEP_FILES=STEP_FILES,
        STEP_KIB=STEP_KIB,
        STEP_PIPES=STEP_PIPES,
        STEP_DENTRIES=STEP_DENTRIES,
        STEP_FORKS=STEP_FORKS,
        CACHE_FILES=CACHE_FILES,
    )


def decoder() -> str:
    """The decoder script (the same for every trial)."""
    return _fill(DECODER, CACHE_FILES=CACHE_FILES)


def _bits(value: int) -> list[int]:
    return [value >> i & 1 for i in range(BITS)]


def decode_magnitude(secrets: Sequence[int], values: Sequence[float]) -> list[int]:
    """Best-offset difference decoder (module docstring); one estimate per trial after the first.

    Tries every unit size the encoder might use on this feature (the
    attacker knows the scheme but not the kernel's per-unit cost) and keeps
    the one that decodes best: an upper bound on what a real decoder gets.
    """
    deltas = [values[t] - values[t - 1] for t in range(1, len(values))]
    best: list[int] = []
    best_score = -1
    for step in _candidate_steps(deltas):
        offset = statistics.median(d - s * step for d, s in zip(deltas, secrets[1:], strict=True))
        guess = [round((d - offset) / step) % 2**BITS for d in deltas]
        score = correct_bits(secrets[1:], guess)
        if score > best_score:
            best, best_score = guess, score
    return best


def _candidate_steps(deltas: Sequence[float]) -> list[float]:
    spread = max(deltas) - min(deltas) if deltas else 0.0
    if spread == 0:
        return [1.0]
    base = spread / (2**BITS - 1)
    return [base * f for f in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)] + [1.0, -base]


def decode_timing(values_per_bit: Sequence[Sequence[float]]) -> list[int]:
    """Page-cache decoder: bit i is 1 when file i read faster than its median."""
    trials = len(values_per_bit[0])
    medians = [statistics.median(v) for v in values_per_bit]
    return [
        sum(int(values_per_bit[i][t] < medians[i]) << i for i in range(BITS)) for t in range(trials)
    ]


def correct_bits(secrets: Sequence[int], guesses: Sequence[int]) -> int:
    """How many secret bits the guesses got right."""
    return sum(
        a == b
        for s, g in zip(secrets, guesses, strict=True)
        for a, b in zip(_bits(s), _bits(g), strict=True)
    )


def at_chance(correct: int, total: int) -> bool:
    """True when ``correct`` of ``total`` bits is within chance (see module docstring)."""
    # two-sided: a decoder that is reliably wrong is a decoder (invert it)
    return abs(correct - total / 2) <= CHANCE_SIGMAS * math.sqrt(total) / 2


def capacity_bits(correct: int, total: int) -> float:
    """Bits per trial of a binary symmetric channel with the observed error rate."""
    if total == 0:
        return 0.0
    p = min(correct, total - correct) / total  # an inverted decoder is as good
    entropy = 0.0 if p == 0 else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
    return BITS * (1 - entropy)


MAGNITUDE_FEATURES = (
    "age_pid1", "age_shm", "age_out",
    "ino_out", "ino_script", "ino_repo_dir", "ino_new_repo", "ino_new_query", "ino_new_tmp",
    "ino_new_shm", "bfree_repo", "ffree_repo", "bfree_query", "ffree_query", "bfree_tmp",
    "ffree_tmp", "bfree_shm", "ffree_shm", "ino_pipe", "ino_socket", "pid_child",
    "proc_dentry_state", "proc_dentry_negative", "proc_inode_nr", "proc_file_nr",
    "proc_memfree", "proc_procs_running",
)  # fmt: skip
#: Channels as reported: name -> features decoded together (the best one counts).
CHANNELS: Mapping[str, tuple[str, ...]] = {
    "workspace inode counter": ("ino_out", "ino_script", "ino_repo_dir", "ino_new_repo"),
    "container tmpfs inode counters": ("ino_new_query", "ino_new_tmp", "ino_new_shm"),
    "free blocks/inodes": (
        "bfree_repo", "ffree_repo", "bfree_query", "ffree_query", "bfree_tmp", "ffree_tmp",
        "bfree_shm", "ffree_shm",
    ),
    "pipe/socket inode counter": ("ino_pipe", "ino_socket"),
    "pid numbers": ("pid_child",),
    "/proc counters": (
        "proc_dentry_state", "proc_dentry_negative", "proc_inode_nr", "proc_file_nr",
        "proc_memfree", "proc_procs_running",
    ),
    # how long ago the decoder's container was prepared (issue 20; absolute values)
    "prepared container age": ("age_pid1", "age_shm", "age_out"),
}  # fmt: skip
#: Features that are a level, not a counter: the decoder reads the value
#: itself (not its difference from the previous trial's).
ABSOLUTE_FEATURES = frozenset({"age_pid1", "age_shm", "age_out"})


def evaluate(
    secrets: Sequence[int], observations: Sequence[Mapping[str, float]]
) -> dict[str, tuple[int, int, str]]:
    """Channel -> (correct bits, total bits, best feature), page cache included."""
    results: dict[str, tuple[int, int, str]] = {}
    for channel, features in CHANNELS.items():
        best = (-1, 0, "")
        for feature in features:
            values = [float(o[feature]) for o in observations]
            if feature in ABSOLUTE_FEATURES:
                # running sums: the difference decoder then sees each level itself
                values = list(itertools.accumulate(values))
            guess = decode_magnitude(secrets, values)
            score = correct_bits(secrets[1:], guess)
            if score > best[0]:
                best = (score, BITS * (len(secrets) - 1), feature)
        results[channel] = best
    timing = [[float(o[f"cache_ns_{i}"]) for o in observations] for i in range(BITS)]
    guess = decode_timing(timing)
    results["page cache (read timing)"] = (
        correct_bits(secrets, guess),
        BITS * len(secrets),
        "cache_ns_*",
    )
    return results
