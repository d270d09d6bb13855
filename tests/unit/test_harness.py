"""One test harness: read from the source of ``tests/`` and ``benchmarks/``.

- ``tests/support/`` alone gives the helpers every test shares: :func:`wait_for`
  (tests/support/wait.py), :func:`free_port` (tests/support/ports.py) and the daemon runner
  (tests/support/daemon.py); a module elsewhere that defines its own gets a second contract.
  The first two are defined in benchmarks/local_servers.py, which the benchmarks import
  instead of the tests.
- No module imports a ``test_*`` module: what two tests share lives in ``tests/support/``.
- No module imports a ``conftest``: pytest imports each conftest itself (as a plugin, under
  its own rules), so an import of one as a module is a second, fragile copy; fixtures stay in
  conftests, what tests import from them lives in ``tests/support/``.
- No test starts ``hydrator run`` by hand (``subprocess.Popen``) but the two named in
  :data:`OWN_DAEMON`, which :class:`tests.support.daemon.Daemon` cannot run yet.
- No test assigns a private attribute of an object it did not make (``source._client = ...``,
  ``monkeypatch.setattr(module, "_LIMIT", ...)``): it tests what the code's public injection
  points (constructor arguments, factories) allow, so a refactor of private names breaks no test.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUPPORT = REPO / "tests" / "support"
SHARED_HOME = REPO / "benchmarks" / "local_servers.py"  # wait_for, free_port, for benchmarks too
SHARED = frozenset({"wait_for", "wait_until", "eventually", "free_port"})  # functions
RUNNERS = ("Daemon",)  # class names ending so: a process runner of the daemon


@functools.cache
def modules() -> tuple[tuple[str, ast.Module], ...]:
    """(path relative to the repo, syntax tree) of every Python file under tests/, benchmarks/."""
    return tuple(
        (str(path.relative_to(REPO)), ast.parse(path.read_text(), str(path)))
        for folder in ("tests", "benchmarks")
        for path in sorted((REPO / folder).rglob("*.py"))
    )


def imported_tests(tree: ast.Module) -> list[str]:
    """The ``test_*`` modules ``tree`` imports (``import a.test_b``, ``from a.test_b import c``,
    ``from a import test_b``, relative forms too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _names_a_test(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if _names_a_test(module):
                found.append(module)
            found += [f"{module}.{a.name}" for a in node.names if a.name.startswith("test_")]
    return found


def _names_a_test(module: str) -> bool:
    return any(part.startswith("test_") for part in module.split("."))


def imported_conftests(tree: ast.Module) -> list[str]:
    """The ``conftest`` modules ``tree`` imports (``import a.conftest``, ``from a.conftest
    import b``, ``from a import conftest``, relative forms too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if "conftest" in a.name.split(".")]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if "conftest" in module.split("."):
                found.append(module)
            found += [f"{module}.conftest" for a in node.names if a.name == "conftest"]
    return found


def own_helpers(tree: ast.Module) -> list[str]:
    """The shared helpers (:data:`SHARED` functions, ``*Daemon`` classes) ``tree`` defines."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in SHARED:
            found.append(f"def {node.name} (line {node.lineno})")
        elif isinstance(node, ast.ClassDef) and node.name.endswith(RUNNERS):
            found.append(f"class {node.name} (line {node.lineno})")
    return found


def daemon_starts(tree: ast.Module) -> list[str]:
    """``subprocess.Popen`` calls whose command names ``hydrator`` and ``run``: a daemon
    started by hand instead of by tests/support/daemon.py."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args and _names(node.func, "Popen")):
            continue
        command = node.args[0]
        words = [e.value for e in ast.walk(command) if isinstance(e, ast.Constant)]
        if "hydrator" in ast.unparse(command) and "run" in words:
            found.append(f"Popen({ast.unparse(command)}) (line {node.lineno})")
    return found


def _names(func: ast.expr, name: str) -> bool:
    return (isinstance(func, ast.Name) and func.id == name) or (
        isinstance(func, ast.Attribute) and func.attr == name
    )


def private_writes(tree: ast.Module) -> list[str]:
    """Assignments to a private attribute of an object other than ``self``/``cls``, and
    ``setattr``/``monkeypatch.setattr`` of a private name (object or dotted-string form)."""
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and _private(sub.attr) and not _own(sub.value):
                    found.append(f"{ast.unparse(sub)} = (line {sub.lineno})")
        if isinstance(node, ast.Call) and _names(node.func, "setattr") and _sets_private(node.args):
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own(value: ast.expr) -> bool:
    return isinstance(value, ast.Name) and value.id in {"self", "cls"}


def _sets_private(args: list[ast.expr]) -> bool:
    """``setattr(obj, "_x", v)`` on anything but self, or ``monkeypatch.setattr("a.b._x", v)``."""
    if len(args) >= 3 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str):
        return _private(args[1].value) and not _own(args[0])
    if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        return _private(args[0].value.rsplit(".", 1)[-1])
    return False


def test_no_module_imports_a_test_module() -> None:
    found = {path: names for path, tree in modules() if (names := imported_tests(tree))}
    assert found == {}, "move what is shared into tests/support/"


def test_no_module_imports_a_conftest() -> None:
    found = {path: names for path, tree in modules() if (names := imported_conftests(tree))}
    assert found == {}, "move what is imported into tests/support/; keep fixtures in conftest"


def test_only_tests_support_defines_the_shared_helpers() -> None:
    found = {
        path: names
        for path, tree in modules()
        if not (REPO / path).is_relative_to(SUPPORT)
        and REPO / path != SHARED_HOME
        and (names := own_helpers(tree))
    }
    assert found == {}, "use tests/support/wait.py, ports.py, daemon.py"


# Daemons that Daemon cannot run yet, each for a reason of its own.
OWN_DAEMON = {
    "tests/deploy/test_daemon.py": "sandboxed: the unit's seccomp filter as preexec_fn",
    "tests/e2e/test_state_safety.py": "HTTP off; ready when it holds the state lock",
}


def test_only_tests_support_starts_the_daemon() -> None:
    found = {
        path: names
        for path, tree in modules()
        if path.startswith("tests/")
        and not (REPO / path).is_relative_to(SUPPORT)
        and path not in OWN_DAEMON
        and (names := daemon_starts(tree))
    }
    assert found == {}, "run it with tests/support/daemon.py's Daemon"
    assert all(daemon_starts(dict(modules())[path]) for path in OWN_DAEMON), "stale exception"


def test_no_test_writes_a_private_attribute() -> None:
    found = {path: names for path, tree in modules() if (names := private_writes(tree))}
    assert found == {}, "inject through a public argument or factory instead"


@pytest.mark.parametrize(
    ("source", "check", "expected"),
    [
        ("from tests.pool.test_end_to_end import world", imported_tests, 1),
        ("import tests.pool.test_end_to_end as e2e", imported_tests, 1),
        ("from tests.pool import test_end_to_end", imported_tests, 1),
        ("from .test_cycle import run", imported_tests, 1),
        ("from tests.support.wait import wait_for", imported_tests, 0),
        ("from tests.deploy.conftest import DEPLOY", imported_conftests, 1),
        ("import tests.sources.dmapi.conftest as dmapi", imported_conftests, 1),
        ("from tests.deploy import conftest", imported_conftests, 1),
        ("from .conftest import MakeSource", imported_conftests, 1),
        ("from . import conftest", imported_conftests, 1),
        ("import conftest", imported_conftests, 1),
        ("from tests.support.deploy import DEPLOY", imported_conftests, 0),
        ("from tests.support.conftest_like import x", imported_conftests, 0),
        ("def wait_for(what):\n    pass", own_helpers, 1),
        ("def eventually(check):\n    pass", own_helpers, 1),
        ("def free_port():\n    pass", own_helpers, 1),
        ("class LocalDaemon:\n    pass", own_helpers, 1),
        ("def wait_for_rejection(pool):\n    pass", own_helpers, 0),
        ('subprocess.Popen([sys.executable, "-m", "hydrator", "run", "-c", c])', daemon_starts, 1),
        ('Popen([venv_command("hydrator"), "run", "--config", c])', daemon_starts, 1),
        ('subprocess.run([sys.executable, "-m", "hydrator", "once"])', daemon_starts, 0),
        ('subprocess.Popen([sys.executable, "-m", "benchmarks.replay"])', daemon_starts, 0),
        ("source._client = object()", private_writes, 1),
        ("service.store._db: int = 1", private_writes, 1),
        ("budget._left -= 1", private_writes, 1),
        ("monkeypatch.setattr(rucio, '_LIMIT', 3)", private_writes, 1),
        ("monkeypatch.setattr('hydrator.core.plan._DROP', 0.1)", private_writes, 1),
        ("setattr(source, '_client', None)", private_writes, 1),
        ("self._client = client", private_writes, 0),
        ("monkeypatch.setattr(queue, 'MAX_WARNED_NAMES', 3)", private_writes, 0),
        ("source.client_factory = make", private_writes, 0),
    ],
)
def test_each_check_finds_what_it_forbids(
    source: str, check: Callable[[ast.Module], list[str]], expected: int
) -> None:
    """The checks themselves, on lines that break the rule and lines that keep it."""
    assert len(check(ast.parse(source))) == expected
