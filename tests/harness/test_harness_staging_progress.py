"""Staging progress for local seeds (issue 14 item 6): git's own progress reaches stderr.

With ``progress`` on (the default when stderr is a terminal) a ``--seed-source``
directory or bundle is cloned with ``--progress``, so the operator watching a
large repository stage sees git's counters; with it off, staging is silent.
"""

from __future__ import annotations

import os
import secrets

from bounded_query.harness.configuration.config import PrivateRepo
from bounded_query.harness.lifecycle.paths import run_paths
from bounded_query.harness.staging.seeds import SeedSpec, create_private_root, stage_seeds
from tests.harness.bq_harness_helpers import git, make_repo, var_tmp_base

FILES = {f"src/f{i}.py": f"x = {i}\n" for i in range(40)}


def _stage(tmp_path, source, progress: bool) -> None:
    with var_tmp_base() as base:
        paths = run_paths(os.getuid(), tmp_path, secrets.token_hex(16), base=base)
        create_private_root(paths)
        spec = SeedSpec(PrivateRepo("octo/big", "internal"), source)
        [seed] = stage_seeds([spec], paths, {}, None, progress=progress)
        assert (seed.path / "src" / "f1.py").read_text() == "x = 1\n"


def test_local_directory_and_bundle_show_git_progress(tmp_path, capfd):
    source = tmp_path / "src"
    make_repo(source, FILES, commits=3)
    bundle = tmp_path / "big.bundle"
    git(source, "bundle", "create", str(bundle), "--all")
    capfd.readouterr()
    for seed_source in (source, bundle):
        _stage(tmp_path, seed_source, progress=True)
        err = capfd.readouterr().err
        assert "Receiving objects" in err or "Checking objects" in err, err[-2000:]
        _stage(tmp_path, seed_source, progress=False)
        assert capfd.readouterr().err == ""
