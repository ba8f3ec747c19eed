"""Git's view of a staged seed, from the query side, on runc and runsc (issue 12).

The seed is built by the harness's own staging steps (``scrub`` writes the
minimal ``.git/config`` with ``core.checkStat = minimal``; ``make_read_only``),
the broker's view layer refreshes its index on runc, and a query then asks
git what it sees. Two properties, both runtimes:

* a clean tree is recognized from the stat data alone: ``git diff-files``
  (which compares stat data and never re-hashes) lists nothing, so
  ``git status`` does not read every file;
* the cheaper check still sees every ordinary change: edits that keep the
  size (one with its mtime set back to another second), a new file, a
  deletion and a mode change all show in ``git status``. (An edit that keeps
  the size and restores the exact mtime second is the documented blind spot
  of ``core.checkStat = minimal``, harness/staging/seeds.py; the benchmark's
  ``mtime-restored`` question shows it.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bounded_query.harness.staging import seeds as staging
from bounded_query.sandbox import DockerRunner
from tests.sandbox.helpers import (
    GIT_ENV,
    RUNTIMES,
    new_invocation,
    remove_seed,
    settings,
)

pytestmark = pytest.mark.engine

#: Seed files' mtime: far in the past, so no query edit shares its second.
OLD_MTIME = 1_600_000_000

PROBE = r"""
import json, os, subprocess
os.chdir("/query/repo")
def git(*argv):
    return subprocess.run(["git", *argv], capture_output=True, text=True, check=True).stdout
facts = {"config": git("config", "core.checkStat").strip()}
facts["stat_dirty"] = git("diff-files", "--name-only").split()
facts["clean"] = git("status", "--porcelain")
# same size, new content (a plain write: mtime is now)
data = open("src/mod03.py").read()
open("src/mod03.py", "w").write(data.replace("3", "7"))
# same size, and an mtime set back to another second in the past
open("src/mod04.py", "w").write(open("src/mod04.py").read().replace("4", "8"))
os.utime("src/mod04.py", (1_500_000_000, 1_500_000_000))
os.remove("src/mod05.py")
os.chmod("src/mod06.py", 0o755)
open("new.txt", "w").write("new\n")
facts["dirty"] = sorted(git("status", "--porcelain").splitlines())
open("/query/out", "w").write(json.dumps(facts))
"""


@pytest.fixture(scope="module")
def staged_seed(tmp_path_factory) -> Iterator[Path]:
    """A seed staged with the harness's scrub and read-only steps."""
    base = tmp_path_factory.mktemp("staged")
    base.chmod(0o755)
    seed = base / "repo"
    seed.mkdir()
    (seed / "src").mkdir()
    (seed / "README.md").write_text("# fixture\n")
    for i in range(10):
        (seed / "src" / f"mod{i:02d}.py").write_text(f"VALUE = {i}\n" * 20)

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=seed, env=GIT_ENV, check=True, capture_output=True)

    git("-c", "init.templateDir=", "init", "-q", "-b", "main")
    git("add", "-A")
    git("commit", "-q", "-m", "fixture")
    for dirpath, _dirs, files in os.walk(seed):
        if ".git" not in Path(dirpath).parts:
            for name in files:
                os.utime(os.path.join(dirpath, name), (OLD_MTIME, OLD_MTIME))
    git("update-index", "-q", "--refresh")
    home = base / "home"
    home.mkdir()
    staging.scrub(seed, home)
    shutil.rmtree(home)
    staging.make_read_only(seed)
    yield seed
    remove_seed(seed)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_clean_tree_from_stat_data_and_every_change_seen(
    engine, work_root, staged_seed, runtime
):
    cfg = settings(runtime)
    runner = DockerRunner(cfg)
    try:
        assert await runner.warm([staged_seed]) == {str(staged_seed): True}
        inv = new_invocation(cfg, work_root, staged_seed, PROBE)
        report = await runner.run(inv)
        assert report.failure is None, report
        facts = json.loads(report.result or b"{}")
    finally:
        await runner.reconcile()
        runner.close()
    assert facts["config"] == "minimal"
    assert facts["stat_dirty"] == []  # nothing to re-hash
    assert facts["clean"] == ""
    assert facts["dirty"] == sorted(
        [" M src/mod03.py", " M src/mod04.py", " D src/mod05.py", " M src/mod06.py", "?? new.txt"]
    )
