"""What the hook prints is what it validated, whoever else can write on the node.

Threat model in docs/security.md ("The execute-node hook"): another local user, a glidein
payload, the squid and the server may each be hostile. The cached copy is checked like a fresh
answer before it is printed, the cache directory must be the hook's own (else a private one is
used), temporary files are created exclusively and nothing follows a symlink; a value with `$`
(which HTCondor expands in its configuration) is refused in every mode.

Where ownership matters, the attacker and the hook are two real unprivileged local users
(``setpriv``; tests/support/privileges.py), sharing a sticky world-writable TMPDIR as /tmp is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.hook import GOOD, GOOD_LINES, HOOK, Answer, Glidein, run_hook
from tests.support.privileges import as_user

DOWN = "http://127.0.0.1:9"  # the discard port: connection refused
PLANTED = GOOD_LINES.replace('"ska:obs_1","ska:skymodel_v3"', '"ska:planted"')

TAMPERED = {
    "issue-example": "START = true\nRequirements = true\nRank = 1000\n" + GOOD_LINES,
    "start": GOOD_LINES + "START = true\n",
    "requirements": GOOD_LINES + "Requirements = true\n",
    "rank": GOOD_LINES + "Rank = 1000\n",
    "other-site": GOOD_LINES.replace('"SITE_A"', '"SITE_B"'),
    "no-site-line": GOOD_LINES.replace('DataLocalitySite = "SITE_A"\n', ""),
    "dollar": GOOD_LINES.replace('"ska:obs_9"', '"$ENV(HOME)"'),
    "control": GOOD_LINES.replace('"ska:obs_9"', '"ska:obs\x1b[2J"'),
    "expression": GOOD_LINES.replace("= 1795390000", "= time()"),
    "huge": GOOD_LINES.replace('"ska:obs_9"', '"' + "x" * 70000 + '"'),
    "end-line": GOOD,  # a copy never holds the end line: the hook prints its own
}


@pytest.mark.parametrize("kind", list(TAMPERED))
def test_a_tampered_copy_is_not_printed_when_the_server_is_down(
    server: tuple[str, Answer], tmp_path: Path, kind: str
) -> None:
    url, _ = server
    cache = tmp_path / "cache"
    assert run_hook(url, cache).stdout == GOOD
    (cache / "SITE_A.classad").write_text(TAMPERED[kind])

    out = run_hook(DOWN, cache)

    assert (out.returncode, out.stdout) == (0, "")
    assert "cached copy" in out.stderr


@pytest.mark.parametrize("kind", list(TAMPERED))
def test_a_tampered_copy_is_not_printed_when_the_server_answers_304(
    server: tuple[str, Answer], tmp_path: Path, kind: str
) -> None:
    """The ETag that the cache supplies would make the server (or squid) answer 304, which
    means "print your copy": the hook sends it only with a copy that passed validation."""
    url, answer = server
    cache = tmp_path / "cache"
    run_hook(url, cache)
    (cache / "SITE_A.classad").write_text(TAMPERED[kind])

    out = run_hook(url, cache)

    assert "If-None-Match" not in answer.requests[-1]
    assert (out.returncode, out.stdout) == (0, GOOD)  # the fresh answer, as a change
    assert (cache / "SITE_A.classad").read_text() == GOOD_LINES


def test_a_symlink_at_the_cache_is_neither_read_nor_written_through(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    """A payload running as the hook's own user (a glidein's) replaces the copy with a link to
    a file of its choice: the hook reads no link as its copy and writes through none."""
    url, _ = server
    cache = tmp_path / "cache"
    run_hook(url, cache)
    elsewhere = tmp_path / "elsewhere.classad"
    elsewhere.write_text(PLANTED)
    (cache / "SITE_A.classad").unlink()
    (cache / "SITE_A.classad").symlink_to(elsewhere)

    down = run_hook(DOWN, cache)
    up = run_hook(url, cache)

    assert "ska:planted" not in down.stdout + up.stdout
    assert up.stdout == GOOD
    assert elsewhere.read_text() == PLANTED
    assert not (cache / "SITE_A.classad").is_symlink()
    assert (cache / "SITE_A.classad").read_text() == GOOD_LINES


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_cache_dir_writable_by_others_is_refused_for_a_private_one(
    server: tuple[str, Answer], tmp_path: Path, mode: int
) -> None:
    url, _ = server
    cache, tmp = tmp_path / "cache", tmp_path / "tmp"
    tmp.mkdir()
    run_hook(url, cache)
    (cache / "SITE_A.classad").write_text(PLANTED)  # as anyone could have, given the mode
    cache.chmod(mode)
    before = sorted(p.name for p in cache.iterdir())

    down = run_hook(DOWN, cache, env={"TMPDIR": str(tmp)})
    up = run_hook(url, cache, env={"TMPDIR": str(tmp)})
    again = run_hook(DOWN, cache, env={"TMPDIR": str(tmp)})

    assert down.stdout == "" and up.stdout == GOOD
    assert f"cache directory {cache}" in up.stderr and "writable by others" in up.stderr
    assert sorted(p.name for p in cache.iterdir()) == before  # nothing written there
    (private,) = tmp.glob(f"hydrator-hook-{os.getuid()}.*")
    assert private.stat().st_mode & 0o777 == 0o700
    assert (private / "SITE_A.classad").read_text() == GOOD_LINES
    assert again.stdout == GOOD_LINES + "-\n"  # the private copy is found again


def test_without_any_safe_directory_the_hook_refuses_to_run(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    """$TMPDIR itself writable by others and not sticky: no private directory either, and
    every file the hook wrote (its scratch files too) could be swapped under it."""
    url, _ = server
    open_tmp = tmp_path / "open"
    open_tmp.mkdir()
    open_tmp.chmod(0o777)
    env = {"TMPDIR": str(open_tmp)}

    out = run_hook(url, open_tmp / "cache", env=env)

    assert (out.returncode, out.stdout) == (1, "")  # the startd keeps what it had
    assert "printing nothing" in out.stderr
    assert [p.name for p in open_tmp.iterdir()] == ["cache"]  # nothing else left behind
    assert list((open_tmp / "cache").iterdir()) == []


def test_a_glidein_without_any_safe_directory_prints_nothing_and_does_not_fail(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    """The glidein's directory and $TMPDIR both writable by others, not sticky: nothing
    printed or seeded, and exit 0 (a failing setup script would fail the whole glidein)."""
    url, _ = server
    directory, open_tmp = tmp_path / "glidein", tmp_path / "open"
    for path in (directory, open_tmp):
        path.mkdir()
        path.chmod(0o777)
    glidein = Glidein.make(directory, url)
    before = glidein.config.read_text()

    out = glidein.run(env={"TMPDIR": str(open_tmp)})

    assert (out.returncode, out.stdout) == (0, "")
    assert "printing nothing" in out.stderr
    assert glidein.config.read_text() == before


# --- two real users: an attacker and the hook's user ------------------------------------------

ATTACKER = (65534, 65534)  # nobody
HOOK_USER = (64999, 64999)  # an unnamed, unprivileged uid: the hook's user (condor, a pilot)


@dataclass
class Node:
    """A shared sticky world-writable TMPDIR (as /tmp is) and the hook user's private file."""

    tmpdir: Path
    victim: Path

    @property
    def default_cache(self) -> Path:
        return self.tmpdir / f"hydrator-hook-{HOOK_USER[0]}"

    def attacker(self, script: str) -> None:
        """Run ``script`` (sh) as the attacker, in the shared TMPDIR."""
        subprocess.run(
            as_user(*ATTACKER, ["sh", "-euc", script]), cwd=self.tmpdir, check=True, timeout=10
        )

    def hook(self, url: str) -> tuple[subprocess.Popen[str], str]:
        """Start the hook as its user with the default cache directory, and its pid; it waits
        for a line on stdin before it runs (so that an attacker can plant names that embed the
        pid, as a real one would for the next few pids)."""
        wrapper = 'echo "$$"; read -r _; exec "$0" "$@"'
        env = {"PATH": os.environ["PATH"], "TMPDIR": str(self.tmpdir)}
        proc = subprocess.Popen(
            as_user(*HOOK_USER, ["sh", "-c", wrapper, str(HOOK), "--url", url, "--site", "SITE_A"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        return proc, proc.stdout.readline().strip()


@pytest.fixture
def node() -> Iterator[Node]:
    shared = Path(tempfile.mkdtemp(prefix="hydrator-hook-node-"))  # /tmp/pytest-of-root is 0700
    try:
        shared.chmod(0o1777)
        home = shared / "home"
        home.mkdir(mode=0o700)
        victim = home / "precious"
        victim.write_text("precious\n")
        for path in (home, victim):
            os.chown(path, *HOOK_USER)
        yield Node(shared, victim)
    finally:
        shutil.rmtree(shared)


def _finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    out, err = proc.communicate("\n", timeout=20)
    assert proc.returncode == 0, err
    return out, err


def test_a_cache_dir_another_user_created_first_is_refused(
    server: tuple[str, Answer], node: Node
) -> None:
    """The attacker creates the hook's predictable default directory first, with a plausible
    copy for another dataset list and the ETag the server has now (so it would answer 304),
    and a decoy where the hook's private fallback directories are named."""
    url, answer = server
    decoy = f"{node.default_cache.name}.AAAAAAAA"
    for directory in (node.default_cache.name, decoy):
        node.attacker(
            f"mkdir -m 777 {directory}; cd {directory}\n"
            f"printf '%s' '{PLANTED}' > SITE_A.classad\n"
            f"printf '%s\\n' '{answer.etag}' > SITE_A.classad.etag\n"
            "chmod 666 SITE_A.classad SITE_A.classad.etag"
        )
    before = {p.name: p.read_bytes() for p in node.default_cache.iterdir()}

    out, err = _finish(node.hook(url)[0])

    assert "ska:planted" not in out
    assert out == GOOD
    assert f"cache directory {node.default_cache} is not owned by" in err
    assert {p.name: p.read_bytes() for p in node.default_cache.iterdir()} == before
    (private,) = (p for p in node.tmpdir.glob(f"{node.default_cache.name}.*") if p.name != decoy)
    assert (private.stat().st_uid, private.stat().st_mode & 0o777) == (HOOK_USER[0], 0o700)
    assert f"using {private}" in err


def test_a_symlink_planted_at_a_temporary_name_redirects_no_write(
    server: tuple[str, Answer], node: Node
) -> None:
    """The attacker owns the cache directory and links the names the hook would write through
    (the copy's temporary names, for the hook's pid) to a file only the hook's user may write."""
    url, _ = server
    node.attacker(f"mkdir -m 777 {node.default_cache.name}")
    proc, pid = node.hook(url)
    names = " ".join(f"SITE_A.classad{s}.tmp.{pid}" for s in ("", ".etag"))
    node.attacker(
        f"cd {node.default_cache.name}; for n in {names}; do ln -s {node.victim} $n; done"
    )

    out, _ = _finish(proc)

    assert out == GOOD
    assert node.victim.read_text() == "precious\n"
    assert not (node.default_cache / "SITE_A.classad").exists()


# --- `$`: HTCondor expands $(...) and $ENV(...) in its configuration -----------------------------

DOLLAR = [
    GOOD.replace('"ska:obs_9"', '"$ENV(HOME)"'),
    GOOD.replace('"0123456789abcdef"', '"$(FULL_HOSTNAME)"'),
    GOOD.replace('"ska:obs_1"', '"ska:obs_$1"'),
]


@pytest.mark.parametrize("body", DOLLAR, ids=["env", "macro", "plain"])
def test_a_value_with_a_dollar_is_refused(
    server: tuple[str, Answer], tmp_path: Path, body: str
) -> None:
    url, answer = server
    run_hook(url, tmp_path / "cache")
    answer.body, answer.etag = body, '"v2"'

    out = run_hook(url, tmp_path / "cache")

    assert (out.returncode, out.stdout) == (0, GOOD_LINES + "-\n")
    assert "$" in out.stderr and "HTCondor" in out.stderr


@pytest.mark.parametrize("body", DOLLAR, ids=["env", "macro", "plain"])
def test_glidein_mode_never_writes_a_dollar_into_the_condor_config(
    server: tuple[str, Answer], tmp_path: Path, body: str
) -> None:
    url, answer = server
    answer.body = body
    glidein = Glidein.make(tmp_path, url)
    before = glidein.config.read_text()

    out = glidein.run()

    assert (out.returncode, out.stdout) == (0, "")
    assert glidein.config.read_text() == before
    assert glidein.condor_vars.read_text() == ""
