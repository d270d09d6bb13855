"""A package docstring that lists its modules lists all of them.

A package's ``__init__`` docstring is the first thing ``help()`` and an IDE show of it, so a
list of its modules there that omits one sends a newcomer past it. The rule checked here:

- A package's *members* are its modules (every ``*.py`` file beside its ``__init__.py``,
  private ``_x.py`` modules INCLUDED, dunder modules such as ``__main__.py`` excluded) and its
  sub-packages (folders with an ``__init__.py``).
- A member is *named* when the docstring writes it in double backticks (````plan````,
  ````plan.py````, ````sources/````) or as a ``:mod:`` reference whose last part is the member
  (``:mod:`.settling```, ``:mod:`hydrator.adapters.sources.dmapi.client```).
- A package whose docstring names at least one of its members must name every member; a
  docstring that names none (a summary only) is not checked.

The docstrings are read with ``ast``: nothing is imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def members(package: Path) -> set[str]:
    """The modules (private ones included) and sub-packages of ``package``, by name."""
    modules = {p.stem for p in package.glob("*.py") if not p.stem.startswith("__")}
    subpackages = {p.parent.name for p in package.glob("*/__init__.py")}
    return modules | subpackages


def named(docstring: str, member: str) -> bool:
    """Whether ``docstring`` names ``member`` in backticks or in a ``:mod:`` reference."""
    name = re.escape(member)
    in_backticks = rf"``{name}(\.py|/)?``"
    in_mod = rf":mod:`[~.\w]*?(?<![\w]){name}`"
    return any(re.search(pattern, docstring) for pattern in (in_backticks, in_mod))


def unnamed_members(root: Path) -> list[str]:
    """``package: member`` for each member a listing package docstring leaves out."""
    problems = []
    for init in sorted((root / "hydrator").rglob("__init__.py")):
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        package = init.parent
        listed = {m for m in members(package) if named(docstring, m)}
        if not listed:
            continue
        where = package.relative_to(root).as_posix()
        problems += [f"{where}: {m}" for m in sorted(members(package) - listed)]
    return problems


def test_every_package_docstring_with_a_module_list_names_all_its_modules() -> None:
    assert unnamed_members(ROOT) == []


def test_the_check_finds_a_module_the_list_omits_and_skips_unlisted_packages(
    tmp_path: Path,
) -> None:
    listing = tmp_path / "hydrator" / "pkg"
    (listing / "sub").mkdir(parents=True)
    (listing / "sub" / "__init__.py").write_text('"""A summary naming no module."""\n')
    for module in ("alpha.py", "beta.py", "_gamma.py", "__main__.py", "delta.py"):
        (listing / module).write_text("")
    (listing / "sub" / "one.py").write_text("")
    (listing / "__init__.py").write_text(
        '"""``alpha.py`` and :mod:`.beta` and :mod:`~hydrator.pkg.sub` and ``alphabet``."""\n'
    )
    (tmp_path / "hydrator" / "__init__.py").write_text('"""No list."""\n')
    assert unnamed_members(tmp_path) == ["hydrator/pkg: _gamma", "hydrator/pkg: delta"]
