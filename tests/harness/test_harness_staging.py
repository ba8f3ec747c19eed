"""Offline staging against a real local git HTTP server with basic auth (spec 14.6)."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
from pathlib import Path

import pytest

from bounded_query.harness.configuration.config import PrivateRepo
from bounded_query.harness.lifecycle.paths import run_paths
from bounded_query.harness.staging.seeds import (
    SeedSpec,
    StagingError,
    askpass_script,
    create_private_root,
    make_read_only,
    reject_external_references,
    remove_read_only_tree,
    scrub,
    server_url,
    stage_seeds,
    verify_seed,
)
from tests.harness.bq_harness_helpers import (
    GitHttpServer,
    all_bytes_under,
    git,
    make_repo,
    publish,
    var_tmp_base,
)

FILES = {"README.md": "hello\n", "src/app.py": "print('hi')\n", "bin/tool": "#!/bin/sh\n"}


@pytest.fixture
def base():
    with var_tmp_base() as path:
        yield path


@pytest.fixture
def paths(base, tmp_path):
    result = run_paths(os.getuid(), tmp_path, secrets.token_hex(16), base=base)
    create_private_root(result)
    return result


def test_stage_over_http_with_askpass_leaves_no_token(tmp_path, paths, capfd):
    token = "tok-" + secrets.token_hex(20)
    source = tmp_path / "src"
    head = make_repo(source, FILES, commits=3)
    (source / "bin" / "tool").chmod(0o755)
    git(source, "add", "-A")
    git(source, "commit", "-q", "-m", "exec bit")
    head = git(source, "rev-parse", "HEAD").strip()
    project_root = tmp_path / "served"
    publish(source, project_root, "octo/alpha")
    env = {"GITHUB_SERVER_URL": "", "GH_TOKEN": token}
    with GitHttpServer(project_root, token) as server:
        env["GITHUB_SERVER_URL"] = server.url + "/"
        seeds = stage_seeds(
            [SeedSpec(PrivateRepo("octo/alpha", "confidential"))],
            paths,
            env,
            token,
            progress=False,
            allow_insecure_server=True,
        )
    # The askpass path really ran: git retried with credentials after a 401.
    assert any(not ok for _m, _p, ok in server.requests)
    assert any(ok for _m, _p, ok in server.requests)
    assert not server.token_seen_in_cmdline
    [seed] = seeds
    assert seed.commit == head
    assert seed.sensitivity == "confidential"
    assert seed.path == paths.seeds_dir / seed.seed_id
    assert len(seed.seed_id) == 32
    assert (seed.path / "src" / "app.py").read_text() == "print('hi')\n"
    # No token in any file of the private root, nor in anything printed.
    for path, data in all_bytes_under(paths.private_root):
        assert token.encode() not in data, path
    out, err = capfd.readouterr()
    assert token not in out
    assert token not in err
    # Staging HOME and askpass helper are gone.
    assert not paths.staging_dir.exists()
    # Scrubbed: minimal config, no remotes, hooks, reflogs, FETCH_HEAD.
    dot_git = seed.path / ".git"
    config = (dot_git / "config").read_text()
    assert "url" not in config
    assert "remote" not in config
    assert "credential" not in config
    for name in ("hooks", "logs", "refs/remotes", "FETCH_HEAD", "objects/info/alternates"):
        assert not os.path.lexists(dot_git / name), name
    assert git(seed.path, "for-each-ref", "refs/remotes").strip() == ""
    assert git(seed.path, "rev-parse", "HEAD").strip() == head
    assert git(seed.path, "status", "--porcelain").strip() == ""
    assert int(git(seed.path, "rev-list", "--count", "HEAD")) == 4
    # Read-only for everyone, readable by others.
    assert stat.S_IMODE(seed.path.stat().st_mode) == 0o555
    assert stat.S_IMODE((seed.path / "README.md").stat().st_mode) == 0o444
    assert stat.S_IMODE((seed.path / "bin" / "tool").stat().st_mode) == 0o555
    if os.geteuid() == 0:  # only the query's group may traverse (issue 8)
        assert stat.S_IMODE(paths.private_root.stat().st_mode) == 0o710
        assert paths.private_root.stat().st_gid == 65534
        assert stat.S_IMODE(paths.seeds_dir.stat().st_mode) == 0o710
    else:
        assert stat.S_IMODE(paths.private_root.stat().st_mode) == 0o711


def test_scrub_removes_every_external_reference_from_a_dirty_checkout(tmp_path):
    secret = "s3cret-" + secrets.token_hex(8)
    other = tmp_path / "other"
    make_repo(other, {"x": "x\n"})
    seed = tmp_path / "seed"
    head = make_repo(seed, FILES, commits=2)
    dot_git = seed / ".git"
    git(seed, "remote", "add", "origin", f"https://user:{secret}@example.invalid/o/r.git")
    git(seed, "config", "credential.helper", f"store --file=/{secret}")
    git(seed, "update-ref", "refs/remotes/origin/main", head)
    git(seed, "update-ref", "refs/remotes/origin/packed", head)
    git(seed, "pack-refs", "--all")
    git(seed, "update-ref", "refs/remotes/origin/loose", head)
    git(seed, "worktree", "add", "-q", "--detach", str(tmp_path / "wt"))
    (dot_git / "hooks" / "post-checkout").write_text(f"#!/bin/sh\necho {secret}\n")
    (dot_git / "objects" / "info" / "alternates").write_text(f"{other}/.git/objects\n")
    (dot_git / "FETCH_HEAD").write_text(f"{head}\t\tbranch 'main' of https://{secret}@x/\n")
    (dot_git / "ORIG_HEAD").write_text(head + "\n")
    (dot_git / "config.worktree").write_text(f"[credential]\n\thelper = {secret}\n")
    (dot_git / "remotes").mkdir()
    (dot_git / "remotes" / "legacy").write_text(f"URL: https://{secret}@example.invalid/r\n")
    assert (dot_git / "logs" / "HEAD").exists()
    home = tmp_path / "home"
    home.mkdir()

    scrub(seed, home)

    for name in (
        "hooks",
        "logs",
        "worktrees",
        "refs/remotes",
        "remotes",
        "FETCH_HEAD",
        "ORIG_HEAD",
        "objects/info/alternates",
        "config.worktree",
    ):
        assert not os.path.lexists(dot_git / name), name
    for path, data in all_bytes_under(dot_git):
        assert secret.encode() not in data, path
        assert b"refs/remotes/" not in data, path
    assert (dot_git / "config").read_text().splitlines()[0] == "[core]"
    assert git(seed, "remote").strip() == ""
    assert git(seed, "for-each-ref", "--format=%(refname)").split() == ["refs/heads/main"]
    assert git(seed, "rev-parse", "HEAD").strip() == head
    assert git(seed, "status", "--porcelain").strip() == ""
    git(seed, "fsck", "--no-dangling")


def test_wrong_token_fails_without_leaking_it(tmp_path, paths):
    source = tmp_path / "src"
    make_repo(source, FILES)
    project_root = tmp_path / "served"
    publish(source, project_root, "octo/alpha")
    wrong = "wrong-" + secrets.token_hex(8)
    with GitHttpServer(project_root, "right-token") as server:
        env = {"GITHUB_SERVER_URL": server.url}
        with pytest.raises(StagingError) as info:
            stage_seeds(
                [SeedSpec(PrivateRepo("octo/alpha", "internal"))],
                paths,
                env,
                wrong,
                progress=False,
                allow_insecure_server=True,
            )
    assert wrong not in str(info.value)
    assert str(info.value).startswith("octo/alpha: clone failed")
    assert not paths.staging_dir.exists()


def test_missing_credential_for_remote_repo(paths):
    with pytest.raises(StagingError, match="no staging credential"):
        stage_seeds([SeedSpec(PrivateRepo("octo/alpha", "internal"))], paths, {}, None)


def test_seed_source_directory_and_bundle(tmp_path, paths):
    source = tmp_path / "src"
    head = make_repo(source, FILES, commits=2)
    bundle = tmp_path / "repo.bundle"
    git(source, "bundle", "create", str(bundle), "--all")
    specs = [
        SeedSpec(PrivateRepo("octo/dir", "internal"), source),
        SeedSpec(PrivateRepo("octo/bundle", "sealed"), bundle),
    ]
    seeds = stage_seeds(specs, paths, {}, None, progress=False)
    assert [s.commit for s in seeds] == [head, head]
    for seed in seeds:
        assert (seed.path / "README.md").read_text() == "hello\n"
        assert not (seed.path / ".git" / "objects" / "info" / "alternates").exists()
        assert str(source) not in (seed.path / ".git" / "config").read_text()
    assert seeds[0].seed_id != seeds[1].seed_id


def test_submodules_are_rejected(tmp_path, paths):
    source = tmp_path / "src"
    make_repo(source, {**FILES, ".gitmodules": '[submodule "x"]\n\tpath = x\n\turl = ../x\n'})
    with pytest.raises(StagingError, match="submodules"):
        stage_seeds([SeedSpec(PrivateRepo("o/r", "internal"), source)], paths, {}, None)
    assert not paths.staging_dir.exists()


def test_symlinked_git_and_gitdir_pointer_are_rejected(tmp_path):
    real = tmp_path / "real"
    make_repo(real, FILES)
    link = tmp_path / "link"
    link.mkdir()
    (link / ".git").symlink_to(real / ".git")
    with pytest.raises(StagingError, match="symlink"):
        reject_external_references(link)
    pointer = tmp_path / "pointer"
    pointer.mkdir()
    (pointer / ".git").write_text(f"gitdir: {real / '.git'}\n")
    with pytest.raises(StagingError, match="gitdir pointer"):
        reject_external_references(pointer)
    (real / ".git" / "modules").mkdir()
    with pytest.raises(StagingError, match="submodules"):
        reject_external_references(real)


def test_verify_catches_unreadable_and_writable_entries(paths):
    seed = paths.seeds_dir / "ab"
    seed.mkdir()
    (seed / "f").write_text("x")
    (seed / "d").mkdir()
    make_read_only(seed)
    verify_seed(seed, paths.private_root)
    os.chmod(seed / "f", 0o400)
    with pytest.raises(StagingError, match="'f' has mode"):
        verify_seed(seed, paths.private_root)
    os.chmod(seed / "f", 0o644)
    with pytest.raises(StagingError, match="'f' has mode"):
        verify_seed(seed, paths.private_root)
    os.chmod(seed / "f", 0o444)
    os.chmod(seed, 0o500)  # the reference's mistake: the seed root unreadable by others
    with pytest.raises(StagingError, match=r"'\.' has mode"):
        verify_seed(seed, paths.private_root)
    os.chmod(seed, 0o555)
    os.chmod(paths.seeds_dir, 0o700)
    with pytest.raises(StagingError, match="not traversable"):
        verify_seed(seed, paths.private_root)
    os.chmod(paths.seeds_dir, 0o711)


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid 65534 probe needs root")
def test_query_uid_probe_catches_what_static_bits_miss(paths):
    seed = paths.seeds_dir / "cd"
    seed.mkdir()
    (seed / "f").write_text("x")
    make_read_only(seed)
    # Owned by the query uid with no owner bits: "other" may read, the owner
    # may not -- only the real probe sees it.
    os.chown(seed / "f", 65534, 65534)
    os.chmod(seed / "f", 0o044)
    with pytest.raises(StagingError, match="uid 65534 cannot read"):
        verify_seed(seed, paths.private_root)


def test_special_files_rejected(paths):
    seed = paths.seeds_dir / "ef"
    seed.mkdir()
    os.mkfifo(seed / "fifo")
    with pytest.raises(StagingError, match="special file"):
        make_read_only(seed)


def test_private_root_must_be_new(paths):
    with pytest.raises(StagingError, match="already exists"):
        create_private_root(paths)


def test_remove_tree_handles_read_only_trees(paths):
    seed = paths.seeds_dir / "aa"
    (seed / "x" / "y").mkdir(parents=True)
    (seed / "x" / "y" / "f").write_text("z")
    make_read_only(seed)
    remove_read_only_tree(paths.private_root)
    assert not paths.private_root.exists()


@pytest.mark.parametrize(
    "url",
    ["ftp://h", "https://user:pw@h", "https://h/?q=1", "https://h/#f", "file:///x", "https://"],
)
def test_server_url_rejects_unsafe_values(url):
    with pytest.raises(StagingError):
        server_url({"GITHUB_SERVER_URL": url})


def test_server_url_refuses_plain_http_unless_the_operator_allows_it():
    env = {"GITHUB_SERVER_URL": "http://127.0.0.1:8080"}
    with pytest.raises(StagingError, match="not https"):
        server_url(env)
    assert server_url(env, allow_insecure=True) == "http://127.0.0.1:8080"
    with pytest.raises(StagingError):
        server_url({"GITHUB_SERVER_URL": "https://h'o/x"}, allow_insecure=True)


def test_plain_http_repository_is_refused_before_any_clone(tmp_path, paths):
    with pytest.raises(StagingError, match="not https"):
        stage_seeds(
            [SeedSpec(PrivateRepo("octo/alpha", "internal"))],
            paths,
            {"GITHUB_SERVER_URL": "http://127.0.0.1:9"},
            "tok",
            progress=False,
        )
    assert not paths.staging_dir.exists()


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        ("Username for 'https://ghe.example:8443': ", "x-access-token\n"),
        ("Password for 'https://x-access-token@ghe.example:8443': ", "SECRET\n"),
        ("Password for 'https://x-access-token@evil.example': ", None),
        ("Password for 'https://x-access-token@ghe.example': ", None),
        ("Password for 'http://x-access-token@ghe.example:8443': ", None),
        ("Password for 'https://someone@ghe.example:8443': ", None),
        ("Username for 'https://evil.example': ", None),
        ("Password: ", None),
        ("", None),
    ],
)
def test_askpass_answers_only_for_the_configured_origin(tmp_path, prompt, answer):
    helper = tmp_path / "askpass.sh"
    helper.write_text(askpass_script("https://ghe.example:8443"))
    helper.chmod(0o700)
    done = subprocess.run(
        [str(helper), prompt],
        env={"BQ_STAGING_CREDENTIAL": "SECRET", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    if answer is None:
        assert done.returncode != 0
        assert done.stdout == ""
    else:
        assert done.returncode == 0
        assert done.stdout == answer


@pytest.mark.parametrize(
    "origin", ["https://a'b", "https://a b", "https://a*", "ftp://a", "https://"]
)
def test_askpass_refuses_an_origin_it_cannot_quote(origin):
    with pytest.raises(StagingError):
        askpass_script(origin)


def test_server_url_default_and_normalization():
    assert server_url({}) == "https://github.com"
    assert server_url({"GITHUB_SERVER_URL": "https://ghe.example/"}) == "https://ghe.example"


def test_repo_path_must_exist_for_seed_source(tmp_path, paths):
    with pytest.raises(StagingError, match="clone failed"):
        stage_seeds(
            [SeedSpec(PrivateRepo("o/r", "internal"), tmp_path / "nope")],
            paths,
            {},
            None,
            progress=False,
        )


def test_no_world_writable_paths_and_private_entries_closed(tmp_path, paths):
    source = tmp_path / "src"
    make_repo(source, FILES)
    stage_seeds([SeedSpec(PrivateRepo("o/r", "internal"), source)], paths, {}, None)
    for entry in Path(paths.private_root).rglob("*"):
        if not entry.is_symlink():
            assert not entry.lstat().st_mode & 0o002, entry
