"""Tracing workload for the query seccomp profile (see seccomp/recipe/README.md).

Runs as the query script under the real entrypoint and exercises what query
scripts ordinarily do with the Python standard library and read-only git use.
"""

import concurrent.futures
import hashlib
import json
import mmap
import os
import re
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import zlib

REPO = "/query/repo"


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, check=True).stdout


total = 0
for dirpath, _dirnames, filenames in os.walk(REPO):
    for name in filenames:
        path = os.path.join(dirpath, name)
        st = os.stat(path)
        with open(path, "rb") as fh:
            data = fh.read()
        total += len(data) + st.st_size
        hashlib.sha256(data).hexdigest()
        re.findall(rb"[a-z_]+", data[:4096])
        zlib.compress(data[:4096])
git("log", "--oneline", "-n", "5")
git("grep", "-n", "-e", "a", "--", ".")
git("status", "--porcelain")
git("ls-files")
git("rev-parse", "HEAD")
git("show", "--stat", "HEAD")
git("cat-file", "-p", "HEAD")
git("diff", "HEAD")
git("blame", "--", "README.md")
with open(os.path.join(REPO, "README.md"), "a") as text:
    text.write("edited\n")
git("add", "README.md")
git("-c", "user.name=q", "-c", "user.email=q@q", "commit", "-q", "-m", "edit")
git("log", "-p", "-n", "1")
git("checkout", "-q", "-b", "scratch")
subprocess.run(["sh", "-c", "echo hi | wc -c"], capture_output=True, check=True)
with tempfile.TemporaryDirectory() as tmp:
    shutil.copytree(os.path.join(REPO, "src"), os.path.join(tmp, "copy"))
    shutil.rmtree(os.path.join(tmp, "copy"))
    db = sqlite3.connect(os.path.join(tmp, "x.db"))
    db.execute("create table t (x)")
    db.execute("insert into t values (1)")
    db.commit()
    db.close()
with concurrent.futures.ThreadPoolExecutor(2) as pool:
    list(pool.map(lambda n: hashlib.md5(str(n).encode()).hexdigest(), range(100)))
threading.Event().wait(0.01)
a, b = socket.socketpair()
a.sendall(b"x")
select.select([b], [], [], 1)
b.recv(1)
a.close()
b.close()
with (
    open(os.path.join(REPO, "README.md"), "rb") as raw,
    mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as mm,
):
    mm.find(b"seed")
signal.signal(signal.SIGALRM, lambda *_: None)
signal.setitimer(signal.ITIMER_REAL, 0.001)
time.sleep(0.01)
os.getcwd()
os.listdir("/proc/self/fd")
with open("/tmp/stats.json", "w") as stats:
    json.dump({"total": total}, stats)
with open("/query/out", "w") as out:
    out.write("true")
