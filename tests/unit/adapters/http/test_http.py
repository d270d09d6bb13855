"""The HTTP endpoint on a real socket: the daemon's files served by the aiohttp child process.

ClassAds with ETag/304 and Cache-Control, JSON, probes, metrics, the server restarting, and
every limit of ``[http]`` tried by a client that exceeds it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client import CollectorRegistry

from hydrator.config import parse_config
from hydrator.errors import ConfigError
from hydrator.runtime.http_endpoint import HttpEndpoint
from hydrator.runtime.metrics import Metrics
from hydrator.runtime.service import Service
from hydrator.runtime.wiring import build_service
from tests.support.wait import wait_for

INVENTORY = (
    '[storage.A]\nsite = "SITE_A"\navailable = ["ska:x", "ska:y"]\npartial = { "ska:p" = 0.4 }\n'
)
Started = tuple[str, Service, HttpEndpoint]


@contextlib.contextmanager
def serving(tmp_path: Path, wedged_after_s: float = 300, **http: Any) -> Iterator[Started]:
    """The endpoint on a static inventory in ``tmp_path``; ``http``: [http] keys. Stopped (and
    the service closed) when the context exits."""
    if not (tmp_path / "inv.toml").exists():
        (tmp_path / "inv.toml").write_text(INVENTORY)
    config = parse_config(
        {
            "daemon": {"state_path": "s.sqlite"},
            "sources": [{"type": "static", "path": "inv.toml", "settle_s": 0}],
            "http": {"listen": "127.0.0.1:0", "max_age_s": 30, **http},
        },
        tmp_path,
    )
    metrics = Metrics(CollectorRegistry())
    service = build_service(config, metrics)
    endpoint = HttpEndpoint(service, config.http, wedged_after_s=wedged_after_s, metrics=metrics)
    try:
        endpoint.start()
        yield f"http://127.0.0.1:{endpoint.port}", service, endpoint
    finally:
        endpoint.stop()
        service.close()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Started]:
    with serving(tmp_path) as started:
        yield started


def get(url: str, **headers: str) -> requests.Response:
    return requests.get(url, headers=headers, timeout=5)


def test_readiness_and_classads_with_etag_and_cache_control(started: Started) -> None:
    base, service, _ = started
    assert get(f"{base}/healthz").status_code == 200
    before = get(f"{base}/readyz")
    assert before.status_code == 503 and "static" in before.text  # names the missing source
    assert get(f"{base}/v1/sites/SITE_A/classad").status_code == 404
    service.run_cycle()
    assert get(f"{base}/readyz").status_code == 200
    r = get(f"{base}/v1/sites/SITE_A/classad")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    assert r.headers["Cache-Control"] == "max-age=30, stale-if-error=86400"
    lines = r.text.splitlines()
    assert lines[-1] == "- update:true"
    assert 'AvailableDatasets = { "ska:x","ska:y" }' in lines
    assert 'PartialDatasets = { "ska:p" }' in lines


def test_readyz_waits_for_every_source_unless_the_state_has_it(tmp_path: Path) -> None:
    (tmp_path / "inv.toml").write_text("this is not TOML [")
    with serving(tmp_path) as (base, service, _endpoint):
        service.run_cycle()  # the source fails: nothing known, not ready, and why
        r = get(f"{base}/readyz")
        assert r.status_code == 503 and "static" in r.text and "inv.toml" in r.text
        (tmp_path / "inv.toml").write_text(INVENTORY)
        service.run_cycle()
        assert get(f"{base}/readyz").status_code == 200
    (tmp_path / "inv.toml").write_text("this is not TOML [")
    with serving(tmp_path) as (base, service, _):  # a restart: the state holds last-known-good
        assert get(f"{base}/readyz").status_code == 200
        service.run_cycle()
        assert get(f"{base}/readyz").status_code == 200
        assert '"ska:x"' in get(f"{base}/v1/sites/SITE_A/classad").text


def test_conditional_get_answers_304_until_the_content_changes(started: Started) -> None:
    base, service, _ = started
    service.run_cycle()
    url = f"{base}/v1/sites/SITE_A/classad"
    tag = get(url).headers["ETag"]
    again = get(url, **{"If-None-Match": tag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["ETag"] == tag and again.headers["Cache-Control"].startswith("max-age=30")
    assert get(url, **{"If-None-Match": '"other", ' + tag}).status_code == 304
    assert get(url, **{"If-None-Match": '"stale"'}).status_code == 200


def test_json_views_and_unknown_paths(started: Started) -> None:
    base, service, _ = started
    service.run_cycle()
    sites = get(f"{base}/v1/sites").json()
    assert [(s["site"], s["available"], s["partial"]) for s in sites["sites"]] == [("SITE_A", 2, 1)]
    assert sites["sources"][0]["fresh"] is True
    site = get(f"{base}/v1/sites/SITE_A").json()
    assert site["partial"] == [
        {"dataset": "ska:p", "fraction": 0.4, "bytes_fraction": 0.4, "transfer": "none"}
    ]
    for path in ["/v1/sites/SITE%20A/classad", "/v1/sites/NOPE", "/nope", "/v1/sites/../../etc"]:
        assert get(base + path).status_code == 404, path
    head = requests.head(f"{base}/v1/sites/SITE_A/classad", timeout=5)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) > 0
    assert requests.post(f"{base}/v1/sites", timeout=5).status_code == 405


def test_answers_do_not_name_the_server_software_or_its_version(started: Started) -> None:
    base, service, _ = started
    service.run_cycle()
    for path in ["/v1/sites", "/v1/sites/SITE_A/classad", "/metrics", "/readyz", "/nope"]:
        assert get(base + path).headers["Server"] == "hydrator", path


def test_metrics_of_the_daemon_and_the_server_in_one_scrape(started: Started) -> None:
    base, service, _ = started
    service.run_cycle()
    url = f"{base}/v1/sites/SITE_A/classad"
    tag = get(url).headers["ETag"]
    for _ in range(3):
        get(url, **{"If-None-Match": tag})
    get(f"{base}/v1/sites/NOT_A_SITE/classad")
    get(f"{base}/healthz")
    with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=5) as sock:
        sock.sendall(b"NONSENSE\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.")
    text = get(f"{base}/metrics").text
    assert 'hydrator_datasets{site="SITE_A",state="available"} 2.0' in text
    assert 'hydrator_cycles_total{outcome="ok"} 1.0' in text
    assert 'hydrator_http_requests_total{code="200",route="classad"} 1.0' in text
    assert 'hydrator_http_requests_total{code="304",route="classad"} 3.0' in text
    assert 'hydrator_http_requests_total{code="404",route="classad"} 1.0' in text
    assert 'hydrator_http_requests_total{code="200",route="healthz"} 1.0' in text
    assert 'hydrator_http_requests_total{code="400",route="invalid"} 1.0' in text
    assert "NOT_A_SITE" not in text  # site names from clients never become labels
    assert "hydrator_http_connections " in text
    helps = [line for line in text.splitlines() if line.startswith("# HELP ")]
    assert len(helps) == len(set(helps))


def test_health_fails_when_no_cycle_ends_for_too_long(tmp_path: Path) -> None:
    # 3 s, not 1: on a loaded machine starting the server process alone can take over a second
    with serving(tmp_path, wedged_after_s=3.0) as (base, service, _endpoint):
        assert get(f"{base}/healthz").status_code == 200
        time.sleep(3.2)
        r = get(f"{base}/healthz")
        assert r.status_code == 503 and "no cycle ended" in r.text
        service.run_cycle()
        assert get(f"{base}/healthz").status_code == 200


def test_changes_are_served_when_the_cycle_returns(tmp_path: Path) -> None:
    with serving(tmp_path) as (base, service, _endpoint):
        service.run_cycle()
        url = f"{base}/v1/sites/SITE_A/classad"
        first = get(url)
        (tmp_path / "inv.toml").write_text(
            INVENTORY.replace('"ska:y"', '"ska:z"')
            + '[storage.B]\nsite = "SITE_B"\navailable = []\n'
        )
        service.run_cycle()
        second = get(url)
        assert second.headers["ETag"] != first.headers["ETag"] and '"ska:z"' in second.text
        assert get(f"{base}/v1/sites/SITE_B/classad").status_code == 200
        (tmp_path / "inv.toml").write_text('[storage.B]\nsite = "SITE_B"\navailable = ["ska:b"]\n')
        service.run_cycle()
        assert get(url).status_code == 404  # SITE_A is gone
        assert get(f"{base}/v1/sites/SITE_A").status_code == 404
        assert '"ska:b"' in get(f"{base}/v1/sites/SITE_B/classad").text


def test_every_sites_new_classad_is_served_before_the_site_documents_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Glideins and the startd hook read the ClassAds, people and provisioners the (much
    larger) site documents: after a cycle, the new ad of every changed site is served while
    the first site document is still to be written."""
    with serving(tmp_path) as (base, service, endpoint):
        service.run_cycle()
        (tmp_path / "inv.toml").write_text(
            INVENTORY.replace('"ska:y"', '"ska:z"')
            + '[storage.B]\nsite = "SITE_B"\navailable = ["ska:b"]\n'
        )
        served: dict[str, str] = {}
        write = endpoint.spool.write

        def watched(name: str, body: bytes) -> None:
            if name.startswith("site/") and not served:
                served.update({s: get(f"{base}/v1/sites/SITE_{s}/classad").text for s in "AB"})
            write(name, body)

        monkeypatch.setattr(endpoint.spool, "write", watched)
        service.run_cycle()
        assert '"ska:z"' in served["A"] and '"ska:b"' in served["B"]
        assert '"ska:z"' in get(f"{base}/v1/sites/SITE_A").text  # then the documents


def test_a_server_that_dies_is_restarted_and_counted(tmp_path: Path) -> None:
    with serving(tmp_path) as (base, service, endpoint):
        service.run_cycle()
        child = endpoint._child
        assert child is not None
        os.kill(child.pid, signal.SIGKILL)
        # The public socket stays open while no server runs: a client waits in the accept
        # queue instead of being refused, and is answered by the new server.
        t0 = time.monotonic()
        r = requests.get(f"{base}/v1/sites/SITE_A/classad", timeout=10)
        assert r.status_code == 200 and '"ska:x"' in r.text and endpoint._child is not child
        assert time.monotonic() - t0 < 5
        assert "hydrator_http_front_restarts_total 1.0" in get(f"{base}/metrics").text
    assert child.poll() is not None and endpoint._child is None
    assert not endpoint.directory.exists()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base}/healthz", timeout=2)


def test_a_stopped_server_holds_up_neither_cycles_nor_the_daemons_stop(tmp_path: Path) -> None:
    with serving(tmp_path) as (base, service, endpoint):
        child = endpoint._child
        assert child is not None
        assert endpoint.directory.stat().st_mode & 0o777 == 0o700  # private
        os.kill(child.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            for i in range(3):
                (tmp_path / "inv.toml").write_text(INVENTORY.replace('"ska:y"', f'"ska:n{i}"'))
                assert service.run_cycle().outcome == "ok"
            assert time.monotonic() - t0 < 5
        finally:
            os.kill(child.pid, signal.SIGCONT)
        assert '"ska:n2"' in get(f"{base}/v1/sites/SITE_A/classad").text
        os.kill(child.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        endpoint.stop()  # what SIGTERM to the daemon does; the stopped server is killed
        assert time.monotonic() - t0 < 8 and child.poll() is not None


def test_the_server_lifts_its_open_files_limit_to_the_hard_one(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # what the server inherits
    with contextlib.ExitStack() as stack:
        try:
            base, _, endpoint = stack.enter_context(serving(tmp_path))
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        get(f"{base}/healthz")  # answered: the server has started
        assert endpoint._child is not None
        limits = Path(f"/proc/{endpoint._child.pid}/limits").read_text().splitlines()
        (line,) = [x for x in limits if x.startswith("Max open files")]
        assert line.split()[3:5] == [str(hard), str(hard)]


def connect(base: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=5)


def closed_within(sock: socket.socket, timeout_s: float, drip: bytes = b"") -> float | None:
    """Seconds until the server closes ``sock`` while the client sends ``drip`` every 0.25 s;
    ``None`` if it is still open after ``timeout_s``."""
    t0 = time.monotonic()
    sock.settimeout(0.25)
    while time.monotonic() - t0 < timeout_s:
        try:
            if drip:
                sock.sendall(drip)
            if sock.recv(4096) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


def test_clients_that_send_slowly_or_nothing_are_cut_off_and_others_are_served(
    tmp_path: Path,
) -> None:
    with serving(tmp_path, idle_timeout_s=1.0) as (base, _service, _endpoint):
        get(f"{base}/healthz")
        idle, crlf, drip = connect(base), connect(base), connect(base)
        drip.sendall(b"GET /v1/sites HTTP/1.1\r\n")
        assert get(f"{base}/healthz").status_code == 200  # not blocked by them
        assert (closed_within(idle, 4) or 9) < 2.5
        assert (closed_within(crlf, 4, b"\r\n") or 9) < 2.5
        assert (closed_within(drip, 4, b"X") or 9) < 2.5
        keep = requests.Session()  # a keep-alive connection that was used is closed when idle
        assert keep.get(f"{base}/healthz", timeout=5).status_code == 200
        time.sleep(1.5)
        assert keep.get(f"{base}/healthz", timeout=5).status_code == 200  # reconnects


def test_connections_over_the_limit_are_closed_and_counted(tmp_path: Path) -> None:
    with serving(tmp_path, max_connections=3) as (base, _service, _endpoint):
        held = [connect(base) for _ in range(3)]
        held[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert held[0].recv(4096).startswith(b"HTTP/1.1 200")
        extra = connect(base)
        assert closed_within(extra, 3) is not None
        for sock in held:
            sock.close()
        time.sleep(0.3)
        text = get(f"{base}/metrics").text
        assert "hydrator_http_rejected_connections_total 1.0" in text


def test_a_header_over_the_limit_gets_400(tmp_path: Path) -> None:
    with serving(tmp_path, max_header_bytes=1024) as (base, _service, _endpoint):
        assert get(f"{base}/healthz", **{"X-Pad": "a" * 900}).status_code == 200
        assert get(f"{base}/healthz", **{"X-Pad": "a" * 1100}).status_code == 400
        assert get(f"{base}/healthz" + "?" + "a" * 1100).status_code == 400


def test_the_configured_backlog_is_applied(tmp_path: Path) -> None:
    with serving(tmp_path, backlog=77) as (base, _service, _endpoint):
        get(f"{base}/healthz")  # the server child has called listen() again by now
        port = base.rsplit(":", 1)[1]
        out = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], check=True, capture_output=True, text=True
        ).stdout.split()
        assert out[2] == "77", out  # Send-Q of a listening socket: its backlog


def test_a_busy_listen_address_is_a_config_error(tmp_path: Path, started: Started) -> None:
    _, service, endpoint = started
    listen = f"127.0.0.1:{endpoint.port}"
    busy = endpoint.config.model_copy(update={"listen": listen})
    with pytest.raises(ConfigError) as error:
        HttpEndpoint(service, busy, wedged_after_s=300, metrics=endpoint.metrics)
    assert error.value.key == "http.listen" and listen in str(error.value)


def test_listening_on_every_ipv6_address_also_takes_ipv4(tmp_path: Path) -> None:
    with serving(tmp_path, listen="[::]:0") as (_, _service, endpoint):
        for host in ("127.0.0.1", "[::1]"):
            assert get(f"http://{host}:{endpoint.port}/healthz").status_code == 200


def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout(tmp_path: Path) -> None:
    many = ", ".join(f'"ska:d{i}"' for i in range(20_000))  # a JSON view of ~400 KB
    (tmp_path / "inv.toml").write_text(f'[storage.A]\nsite = "SITE_A"\navailable = [{many}]\n')
    with serving(tmp_path, send_timeout_s=1.0) as (base, service, _endpoint):
        service.run_cycle()
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
        stalled.connect(("127.0.0.1", int(base.rsplit(":", 1)[1])))
        stalled.sendall(b"GET /v1/sites/SITE_A HTTP/1.1\r\nHost: x\r\n\r\n")  # never read
        gauge = "hydrator_http_connections 2.0"  # the stalled one and this scrape
        assert gauge in get(f"{base}/metrics").text
        wait_for(  # well before the 15 s idle timeout
            "the stalled connection let go",
            lambda: gauge not in get(f"{base}/metrics").text,
            timeout_s=8.0,
        )
        stalled.close()
