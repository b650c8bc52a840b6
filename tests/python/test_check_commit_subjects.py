"""scripts/check-commit-subjects.sh on throwaway repositories: subjects after the base commit
must be at most 72 characters, older ones may be anything, shallow clones are checked on what
they have, and every offender is named."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-commit-subjects.sh"
LONG = "x" * 73
OK_72 = "y" * 72


def git(repo, *args):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com",
               GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def commit(repo, subject, body=""):
    message = subject + ("\n\n" + body if body else "")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def check(repo, *args):
    return subprocess.run([str(SCRIPT), *args], cwd=repo, capture_output=True, text=True,
                          check=False)


@pytest.fixture
def repo(tmp_path):
    """A history with a long subject before the base, then the base (also long)."""
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    commit(path, "old " + LONG)
    base = commit(path, "base " + LONG)
    return path, base


def test_short_subjects_after_the_base_pass_and_older_long_ones_are_left(repo):
    path, base = repo
    commit(path, "packaging: a wheel", "A body line longer than seventy-two characters is "
           "fine: only the subject is checked.")
    commit(path, OK_72)
    result = check(path, "--base", base)
    assert result.returncode == 0, result.stderr
    assert "2 commit(s), every subject at most 72 characters" in result.stdout


def test_a_long_subject_after_the_base_fails_naming_the_commit(repo):
    path, base = repo
    commit(path, "fine")
    offender = commit(path, LONG)
    commit(path, "also fine")
    result = check(path, "--base", base)
    assert result.returncode == 1
    assert f"commit {offender[:7]}: subject of 73 characters (at most 72): {LONG}" in result.stderr
    assert "1 of 3 commit(s)" in result.stderr


def test_characters_not_bytes_are_counted(repo):
    path, base = repo
    commit(path, "é" * 72)  # 144 bytes, 72 characters
    assert check(path, "--base", base).returncode == 0
    commit(path, "é" * 73)
    assert check(path, "--base", base).returncode == 1


def test_a_merge_is_checked_too(repo):
    path, base = repo
    git(path, "checkout", "-q", "-b", "topic")
    commit(path, "topic work")
    git(path, "checkout", "-q", "main")
    commit(path, "main work")
    git(path, "merge", "-q", "--no-ff", "topic", "-m", "Merge " + LONG)
    result = check(path, "--base", base)
    assert result.returncode == 1
    assert "subject of 79 characters" in result.stderr


def test_a_shallow_clone_without_the_base_checks_what_it_has(repo, tmp_path):
    path, base = repo
    commit(path, "one")
    commit(path, "two")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "2", f"file://{path}", str(shallow))
    result = check(shallow, "--base", base)
    assert result.returncode == 0, result.stderr
    assert "2 commit(s)" in result.stdout and "shallow clone" in result.stdout
    # A long subject among the commits it has still fails.
    commit(path, LONG)
    shallow_long = tmp_path / "shallow-long"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{path}", str(shallow_long))
    result = check(shallow_long, "--base", base)
    assert result.returncode == 1
    assert "shallow clone" in result.stderr


def test_a_shallow_clone_that_reaches_the_base_checks_only_after_it(repo, tmp_path):
    path, base = repo
    commit(path, "one")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "3", f"file://{path}", str(shallow))
    result = check(shallow, "--base", base)
    assert result.returncode == 0, result.stderr
    assert "1 commit(s)" in result.stdout


def test_a_full_clone_without_the_base_is_an_error(repo):
    path, _ = repo
    commit(path, "fine")
    result = check(path, "--base", "0123456789abcdef0123456789abcdef01234567")
    assert result.returncode == 2
    assert "is not in this repository" in result.stderr


def test_outside_a_work_tree_there_is_nothing_to_check(tmp_path):
    result = check(tmp_path)
    assert result.returncode == 0
    assert "not in a git work tree" in result.stdout


def test_this_repository_passes():
    """The rule holds on this branch (or its shallow CI clone)."""
    result = check(ROOT)
    assert result.returncode == 0, result.stderr
