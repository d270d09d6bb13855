"""Catalogue bytes on the wire: ``hydrator run`` polling every 60 s and ``hydrator run``
with events and the default reconcile, side by side over the same window against one
:mod:`benchmarks.replay` of the same federation with the same churn, each through a counting
proxy of its own; the bytes are the replay's answers as they crossed the proxy.

The churn (``--churn-per-hour`` of the replicas, applied every ``--churn-every-s``) is what
the replay's ``/_bench/churn`` changes; for each holding it touched the scenario publishes
what Rucio's hermes would send, in its format, to a real ActiveMQ broker: ``datasetlock_ok``
for a holding changed or added, ``deletion-done`` of its first file for one removed. Each
daemon's start-up full read is inside the window, as every later one.

    .venv/bin/python -m benchmarks events-bytes --replicas 1000000 --window-s 3600
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from benchmarks.conditions import emit, machine
from benchmarks.events import commit
from tests.support.activemq import DESTINATION, Broker, running_broker
from tests.support.daemon import Daemon

CONFIG = """\
[daemon]
interval_s = 60
jitter_s = 0
state_path = "{dir}/state.sqlite"

[http]
listen = "127.0.0.1:{http_port}"

[[sources]]
type = "rucio"
name = "rucio"
rucio_host = "http://127.0.0.1:{port}"
auth_host = "http://127.0.0.1:{port}"
account = "root"
auth_type = "userpass"
username = "root"
password_file = "{dir}/password"
timeout_s = 120
deadline_s = 600
max_answer_bytes = 2147483648
"""

EVENTS = """
[sources.events]
enabled = true
brokers = ["127.0.0.1:{broker_port}"]
destination = "{destination}"
client_id = "hydrator-bytes"
username = "hydrator"
password_file = "{broker_password}"
"""


class CountingProxy:
    """A TCP proxy on a free port of 127.0.0.1 in front of ``target_port``, in a thread of its
    own; :attr:`down` counts the bytes the target sent (what the daemon read), :attr:`up`
    what the daemon sent."""

    def __init__(self, target_port: int) -> None:
        self.target, self.up, self.down, self.port = target_port, 0, 0, 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        await asyncio.gather(
            self._pipe(reader, up_writer, "up"), self._pipe(up_reader, writer, "down")
        )

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, way: str) -> None:
        try:
            while chunk := await src.read(1 << 16):
                setattr(self, way, getattr(self, way) + len(chunk))
                dst.write(chunk)
                await dst.drain()
        except OSError:
            pass
        finally:
            dst.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


@contextmanager
def replay(replicas: int, churn_fraction: float) -> Iterator[int]:
    """The replay server's port, serving until the context exits."""
    command = [sys.executable, "-m", "benchmarks.replay", "--replicas", str(replicas),
               "--churn-fraction", str(churn_fraction)]  # fmt: skip
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as p:
        assert p.stdout is not None and p.stdin is not None
        try:
            yield int(p.stdout.readline().split()[1])
        finally:
            p.stdin.close()
            p.wait(60)


def hermes_messages(touched: list[list[Any]]) -> list[dict[str, Any]]:
    """What hermes would send for the holdings a churn touched (scope, name, RSE, held)."""
    created = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    out = []
    for scope, name, rse, held in touched:
        if held:
            payload = {"scope": scope, "name": name, "rse": rse, "rule_id": "0" * 32}
            out.append({"event_type": "datasetlock_ok", "payload": payload})
        else:
            payload = {"scope": scope, "name": f"{name}.f000", "rse": rse}
            out.append({"event_type": "deletion-done", "payload": payload})
    return [m | {"created_at": created} for m in out]


def daemon(work: Path, name: str, port: int, broker: Broker | None) -> Daemon:
    """A ``hydrator run`` reading the replay through ``port``: polling, or with events."""
    directory = work / name
    directory.mkdir()
    (directory / "password").write_text("secret\n")
    (directory / "password").chmod(0o600)
    process = Daemon(directory)
    text = CONFIG.format(dir=directory, http_port=process.port, port=port)
    if broker is not None:
        text += EVENTS.format(broker_port=broker.port, destination=DESTINATION,
                              broker_password=broker.password_file("hydrator"))  # fmt: skip
    (directory / "hydrator.toml").write_text(text)
    return process


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both daemons over one window; bytes per hour of each and their ratio."""
    per_churn = args.churn_per_hour * args.churn_every_s / 3600
    with ExitStack() as stack:
        broker = stack.enter_context(running_broker())
        port = stack.enter_context(replay(args.replicas, per_churn))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        proxies = {mode: CountingProxy(port) for mode in ("polling_60s", "events")}
        for proxy in proxies.values():
            stack.callback(proxy.stop)
        daemons = {m: daemon(work, m, p.port, broker if m == "events" else None)
                   for m, p in proxies.items()}  # fmt: skip
        t0 = time.monotonic()
        for d in daemons.values():
            d.start(work / d.directory.name / "hydrator.toml", ready_timeout_s=600.0, ready=False)
            stack.callback(d.stop)
        churns, changed, messages = 0, 0, 0
        while (now := time.monotonic() - t0) < args.window_s:
            time.sleep(min(args.churn_every_s, args.window_s - now))
            if time.monotonic() - t0 >= args.window_s:
                break
            done = requests.post(f"http://127.0.0.1:{port}/_bench/churn", timeout=600).json()
            sent = hermes_messages(done["touched"])
            broker.publish_as_hermes(sent)
            churns, changed, messages = (
                churns + 1,
                changed + len(done["touched"]),
                messages + len(sent),
            )
        window = time.monotonic() - t0
        figures: dict[str, dict[str, Any]] = {m: {"bytes_read": p.down, "bytes_sent": p.up,
                       "bytes_per_hour": p.down * 3600 / window,
                       "full_reads": daemons[m].metric(
                           "hydrator_source_fetch_duration_seconds_count", source="rucio"),
                       "event_reads": daemons[m].metric("hydrator_event_reads_total",
                                                        source="rucio")}
                   for m, p in proxies.items()}  # fmt: skip
    ratio = figures["polling_60s"]["bytes_read"] / max(1, figures["events"]["bytes_read"])
    return {"replicas": args.replicas, "window_s": window, "churn_per_hour": args.churn_per_hour,
            "churns": churns, "holdings_touched": changed, "messages_published": messages,
            "modes": figures, "bytes_ratio_polling_over_events": ratio}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1_000_000)
    parser.add_argument("--window-s", type=float, default=3600.0)
    parser.add_argument("--churn-per-hour", type=float, default=0.001, help="share of replicas")
    parser.add_argument("--churn-every-s", type=float, default=300.0)
    parser.add_argument("--target", type=float, default=20.0, help="the ratio to reach")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"machine_before": machine(), "code": commit(),
                               "started_utc": datetime.now(UTC).isoformat()}  # fmt: skip
    results |= run(args)
    results |= {"machine_after": machine(), "finished_utc": datetime.now(UTC).isoformat()}
    emit(results, args.json)
    if results["bytes_ratio_polling_over_events"] < args.target:
        print(
            f"TARGET MISSED: ratio {results['bytes_ratio_polling_over_events']:.1f} < {args.target}"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
