"""The execute-node hook (deploy/condor/hydrator-classad-hook) as the startd runs it.

The answers come from a small HTTP server in this process, so that each test can serve exactly
the good, bad or hostile answer it is about; the end-to-end tests in tests/pool run the hook
against the real daemon inside the real pool.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "deploy" / "condor" / "hydrator-classad-hook"
GLIDEIN = REPO / "deploy" / "glidein" / "hydrator_glidein.sh"

GOOD = (
    'AvailableDatasets = { "ska:obs_1","ska:skymodel_v3" }\n'
    "PartialDatasets = {  }\n"
    'ReplicatingDatasets = { "ska:obs_9" }\n'
    'DataLocalitySite = "SITE_A"\n'
    "DataLocalityUpdated = 1795390000\n"
    'DataLocalityDigest = "0123456789abcdef"\n'
    'DataLocalityUnavailable = ""\n'
    "- update:true\n"
)
GOOD_LINES = GOOD.removesuffix("- update:true\n")


STREAM_CAP_BYTES = 200 * 2**20  # a test server must end some day; no hook should get near it


@dataclass
class Answer:
    status: int = 200
    body: str = GOOD
    etag: str = '"v1"'
    delay_s: float = 0.0
    endless: bool = False  # a chunked answer that never ends (up to STREAM_CAP_BYTES)
    sent_bytes: int = 0
    requests: list[dict[str, str]] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        answer = self.server.answer
        answer.requests.append({"path": self.path, **{k: v for k, v in self.headers.items()}})
        time.sleep(answer.delay_s)
        if self.path != "/v1/sites/SITE_A/classad":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.headers.get("If-None-Match") == answer.etag and answer.status == 200:
            self.send_response(304)
            self.send_header("ETag", answer.etag)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if answer.endless:
            self._stream_without_end(answer)
            return
        body = answer.body.encode()
        self.send_response(answer.status)
        self.send_header("ETag", answer.etag)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream_without_end(self, answer: Answer) -> None:
        """What a broken or hostile endpoint may do: chunk after chunk of plausible lines."""
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        line = b'AvailableDatasets = { "ska:obs_1" }\n' * 1800
        chunk = f"{len(line):x}\r\n".encode() + line + b"\r\n"
        try:
            while answer.sent_bytes < STREAM_CAP_BYTES:
                self.wfile.write(chunk)
                answer.sent_bytes += len(line)
                time.sleep(0.0005)  # some 100 MB/s at most, so a test cannot fill the disk
        except OSError:
            return  # the client hung up: what a bounded hook does

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    answer: Answer


@pytest.fixture
def server() -> Iterator[tuple[str, Answer]]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.answer = Answer()
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", srv.answer
    srv.shutdown()
    srv.server_close()


def run_hook(
    url: str,
    cache: Path,
    *args: str,
    site: str = "SITE_A",
    timeout_s: float = 10,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(cache.parent), **(env or {})}
    return subprocess.run(
        [str(HOOK), "--url", url, "--site", site, "--cache-dir", str(cache), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
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
    serve (issue 24): a known attribute, printed like the others."""
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
    """GlideinWMS calls custom scripts as ``script glidein_config entry_id``; the helper
    functions below follow add_config_line.source (gconfig_add, add_condor_vars_line)."""
    url, _ = server
    helpers = tmp_path / "add_config_line.source"
    helpers.write_text(
        'gconfig_add() { echo "$1 $2" >> "$glidein_config"; }\n'
        'add_condor_vars_line() { echo "$*" >> "$condor_vars_file"; }\n'
    )
    condor_vars = tmp_path / "condor_vars.lst"
    condor_vars.write_text("")
    config = tmp_path / "glidein_config"
    config.write_text(
        f"ADD_CONFIG_LINE_SOURCE {helpers}\nCONDOR_VARS_FILE {condor_vars}\n"
        f"GLIDEIN_Site SITE_A\nHYDRATOR_URL {url}\n"
    )
    for _ in range(2):  # setup run, then a periodic run: nothing is added twice
        out = subprocess.run(
            [str(GLIDEIN), str(config), "main"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
            env={"PATH": os.environ["PATH"]},
        )
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


def test_the_hook_and_the_daemon_default_to_the_same_size_limit() -> None:
    """[classad] max_ad_bytes and the hook's --max-bytes must agree (docs/security.md)."""
    from hydrator.config import ClassAdConfig

    assert f"\nDEFAULT_MAX_BYTES={ClassAdConfig().max_ad_bytes}\n" in HOOK.read_text()
    assert GLIDEIN.resolve() == HOOK.resolve(), "the glidein script is the same file"
