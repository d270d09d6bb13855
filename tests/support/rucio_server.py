"""A real Rucio 41.5.1 server for tests, and factory helpers that populate it.

How it is built: ``scripts/rucio-server``. The server runs from a cached venv
(``scripts/rucio-server venv``) in a private temporary directory holding its ``rucio.cfg``,
``alembic.ini``, SQLite database, logs and token file; it listens on 127.0.0.1 on a free port.
The tests and the hydrator talk to it with rucio-clients from the project's own venv.

Use from any test directory::

    from tests.support.rucio_server import rucio_admin, rucio_server, running_rucio  # noqa: F401

and :func:`build_federation` for a populated set of RSEs and datasets with the expected answer,
:func:`source_config` for a hydrator ``RucioSourceConfig`` that talks to the server.

``rucio_server`` (session) is a :class:`RucioServer`; ``server.stop()`` / ``server.start()``
simulate an outage with the same database and port. ``rucio_admin`` (session) is a
:class:`RucioAdmin`, a root client with factory methods (``rse``, ``dataset``, ``rule`` ...).

Run ``python -m tests.support.rucio_server`` (or ``scripts/rucio-server serve``) to get a server
in the foreground for manual work.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from hydrator.config import RucioSourceConfig
from tests.support.ports import free_port
from tests.support.process import die_with_parent, serve_in_foreground, stop_group

REPO = Path(__file__).resolve().parents[2]
RUCIO_VERSION = "41.5.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def ensure_venv() -> Path:
    """The cached server venv (built on first use by ``scripts/rucio-server venv``, ~35 s)."""
    override = os.environ.get("RUCIO_TEST_VENV")
    if override:
        return Path(override)
    out = subprocess.run(
        [str(REPO / "scripts" / "rucio-server"), "venv"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


ALEMBIC_INI = """\
[alembic]
script_location = {script_location}
sqlalchemy.url = {db_url}

[loggers]
keys = root

[handlers]
keys = console

[formatters]
keys = generic

[logger_root]
level = WARNING
handlers = console

[handler_console]
class = StreamHandler
args = (sys.stderr,)
level = NOTSET
formatter = generic

[formatter_generic]
format = %(levelname)s %(name)s %(message)s
"""

RUCIO_CFG = """\
[common]
logdir = {dir}/log
loglevel = WARNING

[client]
rucio_host = {url}
auth_host = {url}
auth_type = userpass
username = {username}
password = {password}
account = root
auth_token_file_path = {dir}/tokens/root-token
request_retries = 0

[database]
default = {db_url}

[bootstrap]
userpass_identity = {username}
userpass_pwd = {password}
userpass_email = root@localhost

[policy]
permission = generic
schema = generic
lfn2pfn_algorithm_default = hash

[alembic]
cfg = {dir}/alembic.ini
"""


@dataclass
class RucioServer:
    """One Rucio server process with its own directory, database, port and root password."""

    venv: Path
    dir: Path
    port: int = field(default_factory=free_port)
    username: str = "hydrator-root"
    password: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    process: subprocess.Popen[bytes] | None = None
    start_s: float = 0.0  # how long the last start took, seconds

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.dir / "rucio.cfg"

    @property
    def password_file(self) -> Path:
        """A file holding the root password (as the hydrator's ``password_file`` wants it)."""
        return self.dir / "root-password"

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUCIO_", "BEARER_"))}
        env["RUCIO_CONFIG"] = str(self.config_path)
        return env

    def setup(self) -> None:
        """Write the configuration and build the schema with the root account (~2 s)."""
        (self.dir / "log").mkdir(parents=True, exist_ok=True)
        (self.dir / "tokens").mkdir(mode=0o700, exist_ok=True)
        db_url = f"sqlite:///{self.dir}/rucio.db"
        site = subprocess.run(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout.strip()
        script_location = f"{site}/rucio/db/sqla/migrate_repo/"
        (self.dir / "alembic.ini").write_text(
            ALEMBIC_INI.format(script_location=script_location, db_url=db_url)
        )
        self.config_path.write_text(
            RUCIO_CFG.format(
                dir=self.dir,
                url=self.url,
                username=self.username,
                password=self.password,
                db_url=db_url,
            )
        )
        self.config_path.chmod(0o600)
        self.password_file.write_text(self.password + "\n")
        self.password_file.chmod(0o600)
        self.run_python(
            "from rucio.db.sqla.util import build_database, create_base_vo, create_root_account\n"
            "build_database(); create_base_vo(); create_root_account()\n"
        )

    def run_python(self, code: str, timeout_s: float = 120.0) -> str:
        """Run ``code`` in the server's venv against its database (server-side core functions)."""
        out = subprocess.run(
            [self.python, "-c", code],
            env=self.env(),
            cwd=self.dir,
            timeout=timeout_s,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"server-side python failed ({out.returncode}):\n{out.stderr[-3000:]}"
            )
        return out.stdout

    def start(self) -> None:
        """Start ``flask run`` on 127.0.0.1:port and wait until ``/ping`` answers."""
        if self.process is not None:
            raise RuntimeError("Rucio test server already running")
        started = time.monotonic()
        log = (self.dir / "log" / "server.log").open("ab")
        self.process = subprocess.Popen(
            [
                *die_with_parent(),
                self.python,
                "-m",
                "flask",
                "--app",
                "rucio.web.rest.flaskapi.v1.main",
                "run",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--no-reload",
                "--no-debugger",
            ],
            env=self.env(),
            cwd=self.dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started

    def _wait_ready(self, started: float) -> None:
        assert self.process is not None
        while time.monotonic() - started < START_TIMEOUT_S:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"Rucio test server exited ({self.process.returncode}):\n" + self.log_tail()
                )
            try:
                if requests.get(f"{self.url}/ping", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(
            f"Rucio test server not ready after {START_TIMEOUT_S} s:\n" + self.log_tail()
        )

    def stop(self) -> None:
        """Stop the server and everything in its process group; idempotent."""
        process, self.process = self.process, None
        if process is not None:
            stop_group(process, STOP_TIMEOUT_S)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, chars: int = 3000) -> str:
        path = self.dir / "log" / "server.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def execute_sql(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Change the database behind the server's back (to fake records no API call can make,
        e.g. a dataset name with a quote); returns the number of rows changed."""
        with contextlib.closing(sqlite3.connect(self.dir / "rucio.db", timeout=30)) as db:
            changed = db.execute(sql, params).rowcount
            db.commit()
        return changed

    def run_daemon(self, name: str, *args: str) -> None:
        """Run one Rucio daemon once (``--run-once``) against this server's database (~3 s)."""
        script = self.venv / "bin" / name
        out = subprocess.run(
            [self.python, str(script), "--run-once", *args],
            env=self.env(),
            cwd=self.dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{name} failed ({out.returncode}):\n{out.stdout[-3000:]}")

    def run_abacus(self) -> None:
        """Fill the dataset summary table (``rucio-abacus-collection-replica --run-once``)."""
        self.run_daemon("rucio-abacus-collection-replica")


def make_server(base: Path | None = None) -> RucioServer:
    """Create, set up and start a server in a new private directory (caller stops it)."""
    venv = ensure_venv()
    work = Path(tempfile.mkdtemp(prefix="rucio-test-", dir=base))
    work.chmod(0o700)
    server = RucioServer(venv=venv, dir=work)
    try:
        server.setup()
        server.start()
    except BaseException:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
        raise
    return server


@pytest.fixture(scope="session")
def rucio_server() -> Iterator[RucioServer]:
    """A running Rucio server for the whole session; stopped and removed at the end."""
    server = make_server()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture()
def running_rucio(rucio_server: RucioServer) -> Iterator[RucioServer]:
    """The session server, guaranteed running before and after the test (outage tests)."""
    if rucio_server.process is None:
        rucio_server.start()
    yield rucio_server
    if rucio_server.process is None:
        rucio_server.start()


_counter = itertools.count(1)


def unique(prefix: str) -> str:
    """A name unique in this test session, usable as an RSE (upper case) or DID name."""
    return f"{prefix}{next(_counter):04d}{uuid.uuid4().hex[:4]}"


class RucioAdmin:
    """A root client with factory methods in the style of Rucio's own test fixtures.

    Every factory returns the name it created; names are unique per session so tests can
    share one server without seeing each other's data.
    """

    def __init__(self, server: RucioServer) -> None:
        from rucio.client import Client  # the project's rucio-clients, not the server venv

        self.server = server
        self.client = Client(
            rucio_host=server.url,
            auth_host=server.url,
            account="root",
            auth_type="userpass",
            creds={"username": server.username, "password": server.password},
            timeout=30,
        )
        self.scopes: set[str] = set()

    def rse(
        self,
        site: str | None = None,
        *,
        tape: bool = False,
        attributes: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> str:
        """Add an RSE (DISK, or TAPE with ``tape``) with a ``site`` attribute unless None."""
        rse = name or unique("TAPE" if tape else "DISK").upper()
        self.client.add_rse(rse, rse_type="TAPE" if tape else "DISK", deterministic=True)
        self.client.add_protocol(
            rse,
            {
                "scheme": "file",
                "hostname": "localhost",
                "port": 0,
                "prefix": f"/rucio/{rse}/",
                "impl": "rucio.rse.protocols.posix.Default",
                "domains": {
                    "lan": {"read": 1, "write": 1, "delete": 1},
                    "wan": {
                        "read": 1,
                        "write": 1,
                        "delete": 1,
                        "third_party_copy_read": 1,
                        "third_party_copy_write": 1,
                    },
                },
            },
        )
        if site is not None:
            self.client.add_rse_attribute(rse, "site", site)
        for key, value in (attributes or {}).items():
            self.client.add_rse_attribute(rse, key, value)
        self.client.set_local_account_limit("root", rse, 10**15)
        return rse

    def scope(self, name: str | None = None) -> str:
        scope = name or unique("s")
        if scope not in self.scopes:
            self.client.add_scope("root", scope)
            self.scopes.add(scope)
        return scope

    def dataset(
        self,
        scope: str,
        files: int = 3,
        *,
        name: str | None = None,
        at: Sequence[str] = (),
        available: int | None = None,
        file_bytes: int = 1000,
    ) -> str:
        """Add a dataset of ``files`` files. With ``at``, register file replicas there: the first
        ``available`` (default all) AVAILABLE, the rest COPYING. No rule is added."""
        if not at:
            raise ValueError("a dataset's files must have a replica somewhere: pass at=[rse]")
        name = name or unique("ds")
        self.client.add_dataset(scope, name)
        dids = [
            {"scope": scope, "name": f"{name}.f{i:03d}", "bytes": file_bytes, "adler32": "0cc737eb"}
            for i in range(files)
        ]
        n_ok = files if available is None else available
        for rse in at:
            ok = [dict(d, state="A") for d in dids[:n_ok]]
            copying = [dict(d, state="C") for d in dids[n_ok:]]
            if ok:
                self.client.add_replicas(rse, ok)
            if copying:
                self.client.add_replicas(rse, copying)
        self.client.attach_dids(scope, name, [{"scope": scope, "name": d["name"]} for d in dids])
        return name

    def many_datasets(self, scope: str, count: int, rse: str, files: int = 1) -> list[str]:
        """Add ``count`` complete datasets at ``rse``, each with a rule there, in a few bulk
        calls (add_dids, add_replicas, attach_dids_to_dids, add_replication_rule)."""
        names = [unique("bulk") for _ in range(count)]
        self.client.add_dids([{"scope": scope, "name": n, "type": "DATASET"} for n in names])
        contents = {
            n: [
                {"scope": scope, "name": f"{n}.f{i:03d}", "bytes": 1000, "adler32": "0cc737eb"}
                for i in range(files)
            ]
            for n in names
        }
        self.client.add_replicas(rse, [dict(f, state="A") for fs in contents.values() for f in fs])
        self.client.attach_dids_to_dids(
            [
                {
                    "scope": scope,
                    "name": n,
                    "dids": [{"scope": scope, "name": f["name"]} for f in fs],
                }
                for n, fs in contents.items()
            ]
        )
        self.client.add_replication_rule([{"scope": scope, "name": n} for n in names], 1, rse)
        return names

    def files(self, scope: str, dataset: str) -> list[str]:
        return sorted(f["name"] for f in self.client.list_files(scope, dataset))

    def rule(self, scope: str, name: str, rse_expression: str, **kwargs: Any) -> str:
        """Add a one-copy replication rule; returns its id."""
        ids = self.client.add_replication_rule(
            [{"scope": scope, "name": name}], 1, rse_expression, **kwargs
        )
        return str(ids[0])

    def rule_info(self, rule_id: str) -> dict[str, Any]:
        return dict(self.client.get_replication_rule(rule_id))

    def set_file_states(self, rse: str, scope: str, names: Sequence[str], state: str) -> None:
        """Move file replicas to a state: "A" AVAILABLE, "C" COPYING, "U" UNAVAILABLE..."""
        self.client.update_replicas_states(
            rse, [{"scope": scope, "name": n, "state": state} for n in names]
        )

    def remove_rule_now(self, rule_id: str, rse: str) -> None:
        """Remove a rule and its replicas at ``rse`` as production would, without the wait.

        ``delete_replication_rule`` only marks a rule for deletion after a grace period
        (docs/platform.md); setting its lifetime to 0 and running judge-cleaner (rule and locks go,
        replicas get a tombstone), the reaper (replicas go) and abacus (the summary row goes)
        does the same now (~10 s).
        """
        self.client.update_replication_rule(rule_id, {"lifetime": 0})
        self.server.run_daemon("rucio-judge-cleaner")
        self.server.run_daemon("rucio-reaper", "--greedy", "--rses", rse)
        self.server.run_abacus()

    def make_stuck(self, rule_id: str) -> None:
        """Make a REPLICATING rule STUCK as failed transfers would, through the public API.

        There is no transfer daemon here. ``update_replicas_states`` with state ``U``
        (UNAVAILABLE) for each file whose lock is still REPLICATING runs the server's
        ``rucio.core.lock.failed_transfer``, which the transfer machinery calls after a
        failed FTS transfer: the lock goes STUCK and the rule follows (``locks_stuck_cnt`` > 0,
        state STUCK). Files already AVAILABLE keep their OK locks.
        """
        stuck: dict[str, list[dict[str, str]]] = {}
        for lock in self.client.list_replica_locks(rule_id):
            if lock["state"] == "REPLICATING":
                file = {"scope": lock["scope"], "name": lock["name"], "state": "U"}
                stuck.setdefault(lock["rse"], []).append(file)
        for rse, files in stuck.items():
            self.client.update_replicas_states(rse, files)
        if self.rule_info(rule_id)["state"] != "STUCK":
            raise RuntimeError(f"rule {rule_id} did not go STUCK: {self.rule_info(rule_id)}")

    def repair(self) -> None:
        """Let the rule engine re-evaluate rules (``rucio-judge-repairer --run-once``): a STUCK
        rule whose locks are all OK again goes OK (~3 s)."""
        self.server.run_daemon("rucio-judge-repairer")


@dataclass
class Federation:
    """A populated set of RSEs and datasets, isolated from other tests by its own ``fed`` RSE
    attribute (select it with ``expression``). ``expected`` is what a correct Rucio source
    reports for it: (site, "scope:name") -> (state value, fraction)."""

    tag: str
    expression: str
    rses: dict[str, str]  # role -> RSE name
    sites: dict[str, str]  # role -> site name
    overrides: dict[str, str]  # the [sites] table: RSE -> site
    scope: str
    datasets: dict[str, str]  # role -> dataset name
    rules: dict[str, str]  # role -> rule id
    expected: dict[tuple[str, str], tuple[str, float]]

    def did(self, role: str) -> str:
        return f"{self.scope}:{self.datasets[role]}"


def build_federation(admin: RucioAdmin) -> Federation:
    """RSEs at three sites plus an unmapped and a tape RSE, and datasets in every state.

    site A: RSEs a1, a2 (``site`` attribute); site B: b1; site C: ``mapped`` (no attribute,
    mapped by ``[sites]``); ``nosite`` (no attribute, not mapped); ``tape`` (TAPE, site A).
    """
    tag = unique("f").lower()
    sites = {"A": f"SITE-A-{tag}", "B": f"SITE-B-{tag}", "C": f"SITE-C-{tag}"}
    fed = {"fed": tag}
    rses = {
        "a1": admin.rse(sites["A"], attributes=fed),
        "a2": admin.rse(sites["A"], attributes=fed),
        "b1": admin.rse(sites["B"], attributes=fed),
        "mapped": admin.rse(None, attributes=fed),
        "nosite": admin.rse(None, attributes=fed),
        "tape": admin.rse(sites["A"], tape=True, attributes=fed),
    }
    scope = admin.scope()
    ds: dict[str, str] = {}
    rules: dict[str, str] = {}

    def placed(role: str, files: int, rse: str) -> str:
        ds[role] = admin.dataset(scope, files, at=[rses[rse]])
        rules[role] = admin.rule(scope, ds[role], rses[rse])
        return ds[role]

    placed("complete", 3, "a1")
    placed("second_rse", 2, "a2")
    placed("at_mapped", 2, "mapped")
    placed("at_nosite", 2, "nosite")
    placed("on_tape", 2, "tape")
    # partial: two of four files temporarily unavailable; the rule stays OK
    partial = placed("partial", 4, "b1")
    admin.set_file_states(rses["b1"], scope, admin.files(scope, partial)[:2], "T")
    # replicating to b1: one of three files arrived
    repl = placed("replicating", 3, "a1")
    rules["replicating_b1"] = admin.rule(scope, repl, rses["b1"])
    admin.set_file_states(rses["b1"], scope, admin.files(scope, repl)[:1], "A")
    # stuck towards the mapped RSE (site C)
    stuck = placed("stuck", 2, "a1")
    rules["stuck_c"] = admin.rule(scope, stuck, rses["mapped"])
    admin.make_stuck(rules["stuck_c"])
    d = {role: f"{scope}:{name}" for role, name in ds.items()}
    expected = {
        (sites["A"], d["complete"]): ("available", 1.0),
        (sites["A"], d["second_rse"]): ("available", 1.0),
        (sites["C"], d["at_mapped"]): ("available", 1.0),
        (sites["B"], d["partial"]): ("partial", 0.5),
        (sites["A"], d["replicating"]): ("available", 1.0),
        # one of three files arrived: present first (partial), the transfer is reported beside
        (sites["B"], d["replicating"]): ("partial", 1 / 3),
        (sites["A"], d["stuck"]): ("available", 1.0),
        (sites["C"], d["stuck"]): ("stuck", 0.0),
    }
    return Federation(
        tag=tag,
        expression=f"rse_type=DISK&fed={tag}",
        rses=rses,
        sites=sites,
        overrides={rses["mapped"]: sites["C"]},
        scope=scope,
        datasets=ds,
        rules=rules,
        expected=expected,
    )


def source_config(server: RucioServer, **overrides: Any) -> RucioSourceConfig:
    """A source config talking to ``server`` as root with userpass, fast retries."""
    values: dict[str, Any] = {
        "type": "rucio",
        "rucio_host": server.url,
        "auth_host": server.url,
        "account": "root",
        "auth_type": "userpass",
        "username": server.username,
        "password_file": server.password_file,
        "rse_expression": "rse_type=DISK",
        "timeout_s": 2.0,
        "max_attempts": 3,
        "backoff_s": 0.05,
    }
    values.update(overrides)
    return RucioSourceConfig(**values)


@pytest.fixture(scope="session")
def rucio_admin(rucio_server: RucioServer) -> RucioAdmin:
    """A root client on the session server with factory methods."""
    return RucioAdmin(rucio_server)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve in the foreground until interrupted; print how to reach the server."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    venv = ensure_venv()
    work = Path(tempfile.mkdtemp(prefix="rucio-serve-"))
    server = RucioServer(venv=venv, dir=work, **({"port": args.port} if args.port else {}))
    return serve_in_foreground(
        server,
        work,
        lambda: (
            f"Rucio {RUCIO_VERSION} at {server.url} (started in {server.start_s:.1f} s)\n"
            f"RUCIO_CONFIG={server.config_path}\n"
            f"root password file: {server.password_file}"
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
