"""The execute-node hook (deploy/condor/hydrator-classad-hook) as the startd runs it.

The answers come from a small HTTP server in this process, so that each test can serve exactly
the good, bad or hostile answer it is about; the end-to-end tests in tests/pool run the hook
against the real daemon inside the real pool.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.hook import (
    GLIDEIN,
    GOOD,
    GOOD_LINES,
    HOOK,
    STREAM_CAP_BYTES,
    Answer,
    Glidein,
    run_hook,
)


def test_good_answer_is_printed_with_an_update_line(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    url, _ = server
    out = run_hook(url, tmp_path / "cache")
    assert out.returncode == 0
    assert out.stdout == GOOD


def test_the_reason_storage_cannot_serve_is_accepted(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    """The daemon adds ``DataLocalityUnavailable`` while some of the site's storage cannot
    serve: a known attribute, printed like the others."""
    url, answer = server
    said = 'DataLocalityUnavailable = "RSE X_DISK: availability_read false"\n'
    answer.body = GOOD.replace('DataLocalityUnavailable = ""\n', said)
    out = run_hook(url, tmp_path / "cache")
    assert (out.returncode, out.stdout, out.stderr) == (0, answer.body, "")
    # all storage back: the daemon leaves the attribute out, the hook says "" (a reason
    # printed before never lingers); a daemon of an earlier release sends none either
    answer.body, answer.etag = GOOD.replace('DataLocalityUnavailable = ""\n', ""), '"v2"'
    again = run_hook(url, tmp_path / "cache")
    assert (again.returncode, again.stdout, again.stderr) == (0, GOOD, "")


def test_the_near_sites_are_accepted(server: tuple[str, Answer], tmp_path: Path) -> None:
    """With ``[distances]`` the daemon's answer carries ``DataLocalityNearSites``: a known
    attribute, printed like the others (an unknown one would make the hook refuse the answer)."""
    url, answer = server
    near = 'DataLocalityNearSites = { "SITE_B","SITE_C" }\n'
    answer.body = GOOD.replace(
        'DataLocalityUnavailable = ""\n', f'DataLocalityUnavailable = ""\n{near}'
    )
    out = run_hook(url, tmp_path / "cache")
    assert (out.returncode, out.stdout, out.stderr) == (0, answer.body, "")


def test_unchanged_answer_uses_if_none_match_and_prints_the_copy(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    url, answer = server
    run_hook(url, tmp_path / "cache")
    again = run_hook(url, tmp_path / "cache")
    assert answer.requests[-1].get("If-None-Match") == '"v1"'
    assert again.stdout == GOOD_LINES + "-\n"  # same lines, no forced collector update


def test_slot_attribute_restricts_the_merge_to_the_sites_slots(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    url, _ = server
    out = run_hook(url, tmp_path / "cache", "--slot-attribute", "GLIDEIN_Site")
    assert out.stdout == (
        GOOD_LINES + 'SlotMergeConstraint = TARGET.GLIDEIN_Site == "SITE_A"\n- update:true\n'
    )


@pytest.mark.parametrize(
    "body",
    [
        GOOD.replace("DataLocalityDigest", "Requirements"),  # not one of our attributes
        GOOD.replace('"ska:obs_1"', '"ska:obs_1" ]; Start = False; ['),  # injection
        GOOD.replace('"SITE_A"', '"SITE_B"'),  # someone else's ad (misrouted cache)
        GOOD.replace("- update:true\n", ""),  # truncated
        GOOD + "Extra = 1\n",  # text after the end line
        GOOD.replace("= 1795390000", "= 1795390000 + 1"),  # an expression, not a value
        "<html>proxy error</html>\n",
        "",
        GOOD.replace('"ska:obs_9"', '"' + "x" * 70000 + '"'),  # beyond the cron line buffer
        GOOD.replace('DataLocalitySite = "SITE_A"\n', ""),  # whose ad is it?
    ],
    ids=[
        "attribute",
        "injection",
        "site",
        "truncated",
        "trailing",
        "expression",
        "html",
        "empty",
        "huge",
        "no-site-line",
    ],
)
def test_bad_answer_falls_back_to_the_last_good_copy(
    server: tuple[str, Answer], tmp_path: Path, body: str
) -> None:
    url, answer = server
    run_hook(url, tmp_path / "cache")
    answer.body, answer.etag = body, '"v2"'
    out = run_hook(url, tmp_path / "cache")
    assert out.returncode == 0
    assert out.stdout == GOOD_LINES + "-\n"
    assert (tmp_path / "cache" / "SITE_A.classad").read_text() == GOOD_LINES


def test_bad_answer_without_a_copy_prints_nothing(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    url, answer = server
    answer.body = GOOD.replace("DataLocalityDigest", "Requirements")
    out = run_hook(url, tmp_path / "cache")
    assert (out.returncode, out.stdout) == (0, "")


@pytest.mark.parametrize("status", [404, 500, 503])
def test_error_status_keeps_the_copy(
    server: tuple[str, Answer], tmp_path: Path, status: int
) -> None:
    url, answer = server
    run_hook(url, tmp_path / "cache")
    answer.status, answer.etag = status, '"v2"'
    out = run_hook(url, tmp_path / "cache")
    assert (out.returncode, out.stdout) == (0, GOOD_LINES + "-\n")


def test_unreachable_hydrator_keeps_the_copy(server: tuple[str, Answer], tmp_path: Path) -> None:
    url, _ = server
    run_hook(url, tmp_path / "cache")
    out = run_hook("http://127.0.0.1:9", tmp_path / "cache")  # discard port: refused
    assert (out.returncode, out.stdout) == (0, GOOD_LINES + "-\n")
    assert "no answer" in out.stderr


def test_slow_hydrator_is_abandoned_after_the_timeout(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    url, answer = server
    run_hook(url, tmp_path / "cache")
    answer.delay_s, answer.etag = 10.0, '"v2"'
    started = time.monotonic()
    out = run_hook(url, tmp_path / "cache", "--timeout", "1")
    assert time.monotonic() - started < 5
    assert (out.returncode, out.stdout) == (0, GOOD_LINES + "-\n")


def test_invalid_site_prints_nothing_and_requests_nothing(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    url, answer = server
    out = run_hook(url, tmp_path / "cache", site="../../etc")
    assert (out.returncode, out.stdout, answer.requests) == (0, "", [])


def test_glidein_mode_reads_glidein_config_prints_lines_and_seeds_the_startd(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    """GlideinWMS calls custom scripts as ``script glidein_config entry_id``."""
    url, _ = server
    glidein = Glidein.make(tmp_path, url)
    config, condor_vars = glidein.config, glidein.condor_vars
    for _ in range(2):  # setup run, then a periodic run: nothing is added twice
        out = glidein.run()
        assert (out.returncode, out.stdout) == (0, GOOD_LINES)  # the wrapper ends the ad
    assert 'AvailableDatasets { "ska:obs_1","ska:skymodel_v3" }' in config.read_text()
    assert condor_vars.read_text().splitlines()[0] == "AvailableDatasets C - + N Y -"
    assert len(condor_vars.read_text().splitlines()) == 7  # DataLocalityUnavailable too
    assert (tmp_path / "hydrator-cache" / "SITE_A.classad").read_text() == GOOD_LINES


def _largest_file_while(proc: subprocess.Popen[str], *dirs: Path) -> int:
    """The largest size any file under ``dirs`` reached while ``proc`` ran (polled)."""
    largest = 0
    while proc.poll() is None:
        for d in dirs:
            for path in d.rglob("*"):
                with contextlib.suppress(OSError):  # removed meanwhile
                    largest = max(largest, path.stat().st_size)
        time.sleep(0.005)
    return largest


def test_an_endless_chunked_answer_is_cut_at_max_bytes_and_the_copy_kept(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    url, answer = server
    run_hook(url, tmp_path / "cache")
    answer.endless, answer.etag = True, '"v2"'
    work = tmp_path / "tmp"
    work.mkdir()
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(HOOK), "--url", url, "--site", "SITE_A", "--cache-dir", str(tmp_path / "cache")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": os.environ["PATH"], "TMPDIR": str(work), "HYDRATOR_TIMEOUT_S": "8"},
    )
    largest = _largest_file_while(proc, work, tmp_path / "cache")
    out, err = proc.communicate(timeout=20)

    assert (proc.returncode, out) == (0, GOOD_LINES + "-\n")
    assert largest <= 60001, f"the hook wrote {largest} bytes"
    assert time.monotonic() - started < 6, "the hook waited for its timeout instead of stopping"
    assert answer.sent_bytes < STREAM_CAP_BYTES
    assert "larger than 60000 bytes" in err


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_max_bytes_is_configurable_and_refuses_a_larger_answer_loudly(
    server: tuple[str, Answer], tmp_path: Path, how: str
) -> None:
    url, answer = server
    run_hook(url, tmp_path / "cache")
    answer.body = GOOD.replace('"ska:obs_9"', ",".join(f'"ska:obs_{i}"' for i in range(300)))
    answer.etag = '"v2"'
    assert 2000 < len(answer.body) < 60000
    args, env = (
        (("--max-bytes", "2000"), {}) if how == "flag" else ((), {"HYDRATOR_MAX_BYTES": "2000"})
    )

    out = run_hook(url, tmp_path / "cache", *args, env=env)

    assert (out.returncode, out.stdout) == (0, GOOD_LINES + "-\n")
    assert "larger than 2000 bytes" in out.stderr
    assert run_hook(url, tmp_path / "cache").stdout.startswith('AvailableDatasets = { "ska:obs_1"')


def test_an_answer_of_exactly_max_bytes_keeps_a_usable_copy(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    """An ad cut to fit is as large as the limit allows; the copy of it (without the end line,
    with the unavailable line the hook adds when the answer has none) is still printed."""
    url, answer = server
    base = GOOD.replace('DataLocalityUnavailable = ""\n', "")
    pad = 2000 - len(base.encode()) + len('"ska:obs_9"') - len('"ska:"')
    answer.body = base.replace('"ska:obs_9"', f'"ska:{"x" * pad}"')
    assert len(answer.body.encode()) == 2000
    first = run_hook(url, tmp_path / "cache", "--max-bytes", "2000")
    assert first.returncode == 0 and first.stdout.endswith("- update:true\n"), first.stderr
    answer.status = 503  # the daemon is away: the copy must do
    again = run_hook(url, tmp_path / "cache", "--max-bytes", "2000")
    assert again.returncode == 0 and "refused" not in again.stderr, again.stderr
    assert again.stdout == first.stdout.removesuffix("- update:true\n") + "-\n"


def test_the_hook_and_the_daemon_default_to_the_same_size_limit() -> None:
    """[classad] max_ad_bytes and the hook's --max-bytes must agree (docs/security.md)."""
    from hydrator.config import ClassAdConfig

    assert f"\nDEFAULT_MAX_BYTES={ClassAdConfig().max_ad_bytes}\n" in HOOK.read_text()
    assert GLIDEIN.resolve() == HOOK.resolve(), "the glidein script is the same file"
