"""Every cross-reference in the package's docstrings and comments names something that exists.

A module's prose points at other code with Sphinx roles (``:func:`planned```,
``:class:`~hydrator.core.model.Model```, ``:mod:`.listing```, ``:meth:`Service.run_cycle```). A
rename leaves such a pointer behind without any error, and a newcomer following it finds
nothing. This module parses ``hydrator/`` with ``ast`` (nothing is imported) into the set of
names it defines: modules, their top-level names, each class's methods, class attributes,
annotated fields and the ``self.x`` attributes its methods set. Then it resolves every
reference the way a reader would:

- ``hydrator.a.b.C.m``: that dotted name;
- ``name`` or ``C.m``: in the referring module (its own classes included), or through the name
  the module imports (``from hydrator.x import C``); a name the module imports from outside
  the package (``datetime``, ``classad2``) is not checked;
- ``.x.C`` or ``..x``: relative to the referring module's package, as an import would read it,
  or else any name ending in ``.x.C`` (Sphinx's search by suffix).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj):`~?([^`<>\s]+)`")
# libraries a reference may name by its full dotted name; not checked
OUTSIDE = frozenset(sys.stdlib_module_names) | {
    "aiohttp",
    "apscheduler",
    "classad2",
    "htcondor2",
    "prometheus_client",
    "pydantic",
    "requests",
    "rucio",
    "stomp",
}


@dataclass
class Package:
    """What a package defines (qualified names) and what each module imports by which name."""

    names: set[str] = field(default_factory=set)
    imports: dict[str, dict[str, str]] = field(default_factory=dict)  # module -> local -> full
    modules: set[str] = field(default_factory=set)
    packages: set[str] = field(default_factory=set)  # modules that are __init__.py
    roots: set[str] = field(default_factory=set)  # the package's own top-level name


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _targets(node: ast.AST) -> Iterator[str]:
    """The names an assignment's target binds (``a``, ``a, b``)."""
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Tuple):
        for element in node.elts:
            yield from _targets(element)


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _class_names(node: ast.ClassDef, prefix: str) -> Iterator[str]:
    """A class's methods, nested classes, class attributes and fields, and every ``self.x``
    its methods assign; its ``__slots__`` too."""
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}.{item.name}"
            for sub in ast.walk(item):
                bound = sub.targets if isinstance(sub, ast.Assign) else []
                if isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
                    bound = [sub.target]
                for target in bound:
                    for one in ast.walk(target):
                        if isinstance(one, ast.Attribute) and _is_self(one.value):
                            yield f"{prefix}.{one.attr}"
        elif isinstance(item, ast.ClassDef):
            yield f"{prefix}.{item.name}"
            yield from _class_names(item, f"{prefix}.{item.name}")
        elif isinstance(item, ast.AnnAssign):
            yield from (f"{prefix}.{n}" for n in _targets(item.target))
        elif isinstance(item, ast.Assign):
            for target in item.targets:
                yield from (f"{prefix}.{n}" for n in _targets(target))
                if isinstance(target, ast.Name) and target.id == "__slots__":
                    slots = ast.literal_eval(item.value)
                    yield from (f"{prefix}.{s}" for s in slots)


def index(root: Path, package: str = "hydrator") -> Package:
    found = Package(roots={package})
    for path in sorted((root / package).rglob("*.py")):
        name, is_package = module_name(path, root)
        found.modules.add(name)
        found.names.add(name)
        if is_package:
            found.packages.add(name)
        imports: dict[str, str] = {}
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(name, is_package, node.module or "", node.level)
                for alias in node.names:
                    imports[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    imports[alias.asname or alias.name.split(".")[0]] = alias.name
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.names.add(f"{name}.{node.name}")
            elif isinstance(node, ast.ClassDef):
                found.names.add(f"{name}.{node.name}")
                found.names.update(_class_names(node, f"{name}.{node.name}"))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    found.names.update(f"{name}.{n}" for n in _targets(target))
        found.imports[name] = imports
    return found


def _absolute(module: str, is_package: bool, target: str, level: int) -> str:
    """``from <level dots><target> import ...`` in ``module`` as an absolute module name."""
    if level == 0:
        return target
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def defined(found: Package, name: str) -> bool:
    """``name`` is defined, following a name a module imports (a package's ``__init__``
    re-exporting a class) to where it is defined."""
    if name in found.names:
        return True
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module, local = ".".join(parts[:cut]), parts[cut]
        imported = found.imports.get(module, {}).get(local)
        if imported is not None:
            return defined(found, ".".join([imported, *parts[cut + 1 :]]))
    return False


def resolves(found: Package, module: str, target: str) -> bool:
    """Whether ``target``, referred to from ``module``, names something (module doc above);
    True also for a name the module imports from outside the package."""
    names = found.names
    if target.startswith("."):
        level = len(target) - len(target.lstrip("."))
        absolute = _absolute(module, module in found.packages, target.lstrip("."), level)
        return defined(found, absolute) or any(n.endswith(target) for n in names)
    head, _, rest = target.partition(".")
    if defined(found, target) or (rest and head in OUTSIDE):
        return True
    depth = module.count(".") + 1
    local = [f"{module}.{target}"]
    local += [
        f"{n}.{target}" for n in names if n.startswith(f"{module}.") and n.count(".") == depth
    ]
    if any(defined(found, candidate) for candidate in local):
        return True
    imported = found.imports.get(module, {}).get(head)
    if imported is None:
        return False
    if imported.split(".")[0] not in found.roots:
        return True  # outside the package: not checked
    return defined(found, f"{imported}.{rest}" if rest else imported)


@dataclass(frozen=True)
class Dangling:
    path: str
    line: int
    target: str


def dangling(root: Path, package: str = "hydrator") -> list[Dangling]:
    found = index(root, package)
    out = []
    for path in sorted((root / package).rglob("*.py")):
        module, _ = module_name(path, root)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in ROLE.finditer(line):
                target = match.group(1).rstrip("()")
                if not resolves(found, module, target):
                    out.append(Dangling(str(path.relative_to(root)), number, target))
    return out


def test_every_docstring_reference_names_something_that_exists() -> None:
    missing = dangling(ROOT)
    shown = "\n".join(f"{d.path}:{d.line}: {d.target}" for d in missing)
    assert not missing, f"references to nothing (renamed or removed?):\n{shown}"


def test_the_check_finds_a_stale_reference_and_accepts_the_short_forms(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text('"""See :mod:`.one` and :mod:`pkg.gone`."""\n')
    (package / "sub" / "one.py").write_text(
        "from datetime import datetime\n"
        "from pkg.sub.two import Two\n\n"
        "class One:\n"
        '    """:meth:`run`, :attr:`held`, :meth:`Two.go`, :class:`datetime`,\n'
        '    :func:`~.two.helper`, :meth:`missing`."""\n\n'
        "    def run(self) -> None:\n"
        "        self.held = 1\n"
    )
    (package / "sub" / "two.py").write_text(
        '"""Points back: :class:`..sub.one.One`, :meth:`.one.One.run`."""\n\n'
        "def helper() -> None: ...\n\n"
        "class Two:\n"
        "    def go(self) -> None: ...\n"
    )
    found = {(d.path, d.line, d.target) for d in dangling(tmp_path, "pkg")}
    assert found == {("pkg/sub/__init__.py", 1, "pkg.gone"), ("pkg/sub/one.py", 6, "missing")}
