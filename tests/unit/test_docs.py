"""Every test a document names exists, and the repository cites only what it contains.

The documents promise behaviour and name the test that keeps each promise; a renamed or never
written test makes the promise empty without anyone noticing. This module finds every test name
in README.md, CONTRIBUTING.md, docs/*.md, deploy/**/README.md and benchmarks/*.md and checks it
against the test files as parsed with ``ast`` (nothing is imported, so it is fast and needs no
service). The forms understood, in the order they appear in a document:

- ``tests/x/test_y.py`` or ``test_y.py``: a test file (a bare file name matches any folder);
- ``tests/x/test_y.py::test_z`` or ``test_y.py::TestC::test_z``: a test in that file;
- ``::test_z``: a test in the file named last before it in the same document;
- ``test_z`` alone (prose, a "tests" column): a test in any test file;
- ``test_z[case]``: a parametrized id; only the function must exist.

The same documents, except benchmarks/*.md (records of past runs, which name the code as it was
then), must also name only files and folders of the repository that exist: a path starting with
one of :data:`PATH_STARTS` (``hydrator/...``, ``core/plan.py``, ``deploy/condor/``) is looked up
as written or as the tail of a real path, so a moved or deleted module cannot stay in the docs.

Every document, benchmarks/*.md and benchmarks/results/README.md included, must cite only files
that exist: a ``benchmarks/...`` path, a relative link's target and a file named alone in
backticks (``results/arrival.json``, ``RESULTS.md``) are looked up from the document's folder or
the repository's root, exactly. A file kept only in git history is cited as ``git show
<commit>:benchmarks/<name>``, and a command's output as ``--json benchmarks/<name>``; neither is
looked up.

The code, scripts and deploy files may cite documents too: every ``docs/x.md`` they name must
exist, and none may cite a file kept outside the repository (a fact the code relies on is
written in docs/platform.md, in the project's own words).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

REFERENCE = re.compile(
    r"(?<![\w/.:-])(?:"
    r"(?P<path>(?:[\w.-]+/)*test_\w+\.py)(?P<nodes>(?:::\w+)*)"
    r"|(?P<more>(?:::\w+)+)"
    r"|(?P<bare>test_\w+)"
    r")"
)


PATH = re.compile(r"(?<![\w/.:~$-])((?:[\w.-]+/)+[\w.-]*)")
PATH_STARTS = (
    *("hydrator/", "tests/", "deploy/", "config/", "scripts/", "benchmarks/", "docs/"),
    *("core/", "adapters/", "runtime/", "sources/", "htcondor/", "state/", "http/"),
)
SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def documents(root: Path) -> list[Path]:
    """The documents that name tests, sorted."""
    found = {root / "README.md", root / "CONTRIBUTING.md"}
    found.update((root / "docs").glob("*.md"))
    found.update((root / "deploy").rglob("README.md"))
    found.update((root / "benchmarks").rglob("*.md"))
    return sorted(path for path in found if path.is_file())


def collected_tests(source: str) -> set[str]:
    """The tests pytest would collect from one file: ``test_f``, ``TestC``, ``TestC::test_m``."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names.add(node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    item.name.startswith("test")
                ):
                    names.update({f"{node.name}::{item.name}", item.name})
    return names


def inventory(root: Path) -> dict[str, set[str]]:
    """Every ``test_*.py`` under ``tests/``, by path relative to ``root``, with its tests."""
    return {
        path.relative_to(root).as_posix(): collected_tests(path.read_text(encoding="utf-8"))
        for path in sorted((root / "tests").rglob("test_*.py"))
    }


def _files(path: str, tests: Mapping[str, set[str]]) -> list[str]:
    """The test files a reference names: its exact path, or every file ending with it."""
    return [known for known in tests if known == path or known.endswith("/" + path)]


def missing(doc: str, lines: Iterable[str], tests: Mapping[str, set[str]]) -> list[str]:
    """One ``doc:line: name ...`` line per test or test file a document names that is absent."""
    found: list[str] = []
    everywhere = set().union(*tests.values()) if tests else set()
    current: list[str] = []
    for number, line in enumerate(lines, start=1):
        for match in REFERENCE.finditer(line):
            where = f"{doc}:{number}"
            if match["bare"]:
                if match["bare"] not in everywhere:
                    found.append(f"{where}: {match['bare']} is no test in tests/")
                continue
            if match["path"]:
                current = _files(match["path"], tests)
                if not current:
                    found.append(f"{where}: {match['path']} is no test file")
                    continue
            node = (match["nodes"] or match["more"] or "").removeprefix("::")
            if not node:
                continue
            if not current:
                found.append(f"{where}: ::{node} follows no test file")
            elif not any(node in tests[file] for file in current):
                found.append(f"{where}: {node} is not in {' or '.join(current)}")
    return found


def repository_paths(root: Path) -> set[str]:
    """Every file of the repository as ``a/b.py`` and every folder as ``a/``, under ``root``."""
    found: set[str] = set()
    pending = [root]
    while pending:
        folder = pending.pop()
        for entry in folder.iterdir():
            if entry.name in SKIPPED_DIRS:
                continue
            relative = entry.relative_to(root).as_posix()
            if entry.is_dir() and not entry.is_symlink():  # a link is named, never followed
                found.add(relative + "/")
                pending.append(entry)
            else:
                found.add(relative)
    return found


def missing_paths(doc: str, lines: Iterable[str], paths: set[str]) -> list[str]:
    """One ``doc:line: path ...`` line per repository path a document names that is absent."""
    found: list[str] = []
    for number, line in enumerate(lines, start=1):
        for match in PATH.finditer(line):
            path = match[1].rstrip(".")
            if not path.startswith(PATH_STARTS):
                continue
            tails = {path, path + "/"} if not path.endswith("/") else {path}
            if not any(
                known in tails or known.endswith(tuple("/" + t for t in tails)) for known in paths
            ):
                found.append(f"{doc}:{number}: {path} is no file or folder of the repository")
    return found


def test_every_test_named_in_the_docs_exists() -> None:
    tests = inventory(ROOT)
    problems = [
        problem
        for doc in documents(ROOT)
        for problem in missing(
            doc.relative_to(ROOT).as_posix(), doc.read_text(encoding="utf-8").splitlines(), tests
        )
    ]
    assert not problems, "documents name tests that do not exist:\n" + "\n".join(problems)


def test_the_check_reports_each_missing_name_with_its_document_and_line(tmp_path: Path) -> None:
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_a.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('x', [1])\n"
        "def test_one(x): pass\n"
        "class TestGroup:\n"
        "    async def test_two(self): pass\n"
        "def helper_test_three(): pass\n",
        encoding="utf-8",
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text(
        "Tests: `tests/unit/test_a.py::test_one[case-1]`, `::TestGroup::test_two`,\n"
        "`test_a.py::test_gone`, `::test_two`; `test_one`, `test_three`.\n"
        "| promise | tests |\n"
        "|---|---|\n"
        "| x | `tests/unit/test_b.py`, `::test_one` |\n",
        encoding="utf-8",
    )
    tests = inventory(tmp_path)
    assert tests == {
        "tests/unit/test_a.py": {"test_one", "TestGroup", "TestGroup::test_two", "test_two"}
    }
    assert [doc.name for doc in documents(tmp_path)] == ["x.md"]
    lines = (tmp_path / "docs" / "x.md").read_text(encoding="utf-8").splitlines()
    assert missing("docs/x.md", lines, tests) == [
        "docs/x.md:2: test_gone is not in tests/unit/test_a.py",
        "docs/x.md:2: test_three is no test in tests/",
        "docs/x.md:5: tests/unit/test_b.py is no test file",
        "docs/x.md:5: ::test_one follows no test file",
    ]


def test_every_repository_path_named_in_the_docs_exists() -> None:
    paths = repository_paths(ROOT)
    problems = [
        problem
        for doc in documents(ROOT)
        if doc.parent.name != "benchmarks"
        for problem in missing_paths(
            doc.relative_to(ROOT).as_posix(), doc.read_text(encoding="utf-8").splitlines(), paths
        )
    ]
    assert not problems, "documents name paths that do not exist:\n" + "\n".join(problems)


def test_the_path_check_finds_moved_modules_and_accepts_short_forms(tmp_path: Path) -> None:
    (tmp_path / "hydrator" / "core").mkdir(parents=True)
    (tmp_path / "hydrator" / "core" / "plan.py").write_text("", encoding="utf-8")
    paths = repository_paths(tmp_path)
    assert paths == {"hydrator/", "hydrator/core/", "hydrator/core/plan.py"}
    lines = [
        "`hydrator/core/plan.py`, `core/plan.py`, `hydrator/core/`, `core/` and `hydrator/core`.",
        "`hydrator/core.py` moved; `core/gone.py`; /etc/hydrator/x.toml, ~/core/x, a/core/x.py",
    ]
    assert missing_paths("README.md", lines, paths) == [
        "README.md:2: hydrator/core.py is no file or folder of the repository",
        "README.md:2: core/gone.py is no file or folder of the repository",
    ]


CITED_FILE = re.compile(
    r"`(?P<named>[\w.-]+(?:/[\w.-]+)*\.(?:json|md|png|csv))`"
    r"|\]\((?P<link>[^)\s#:]+)(?:#[^)\s]*)?\)"
    r"|(?<![\w/.:~$-])(?<!--json )(?P<bench>benchmarks/[\w./-]*[\w-])"
)


def missing_files(doc: Path, root: Path) -> list[str]:
    """One ``doc:line: name ...`` line per file ``doc`` cites that is absent (see the module)."""
    found: list[str] = []
    where = doc.relative_to(root).as_posix()
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        for match in CITED_FILE.finditer(line):
            cited = match["named"] or match["link"] or match["bench"]
            if not any((base / cited).exists() for base in (doc.parent, root)):
                found.append(f"{where}:{number}: {cited} does not exist")
    return found


def test_every_file_cited_in_the_docs_exists() -> None:
    problems = [problem for doc in documents(ROOT) for problem in missing_files(doc, ROOT)]
    assert not problems, "documents cite files that do not exist:\n" + "\n".join(problems)


def test_the_file_check_reads_links_names_and_benchmark_paths(tmp_path: Path) -> None:
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "a.json").write_text("{}", encoding="utf-8")
    doc = tmp_path / "benchmarks" / "A.md"
    doc.write_text(
        "[`results/a.json`](results/a.json), `benchmarks/results/a.json`, `A.md`\n"
        "[gone](results/b.json#x), `b.json`, benchmarks/b.json, [web](https://x/y.json)\n"
        "`git show abc1234:benchmarks/b.json`, `--json b.json`, --json benchmarks/b.json\n",
        encoding="utf-8",
    )
    assert missing_files(doc, tmp_path) == [
        "benchmarks/A.md:2: results/b.json does not exist",
        "benchmarks/A.md:2: b.json does not exist",
        "benchmarks/A.md:2: benchmarks/b.json does not exist",
    ]


CODE_DIRS = ("hydrator", "tests", "scripts", "deploy", "benchmarks", "config")
OUTSIDE = re.compile(r"FACTS\.md|shared/")
DOC_CITED = re.compile(r"(?<![\w/.-])docs/[\w.-]+\.md")


def code_files(root: Path) -> list[Path]:
    """The repository's code, scripts, deploy files and configs: what may cite documents."""
    found = [root / "README.md", root / "CONTRIBUTING.md", root / "Dockerfile"]
    for folder in CODE_DIRS:
        found.extend(
            path
            for path in (root / folder).rglob("*")
            if path.is_file()
            and not SKIPPED_DIRS.intersection(path.parts)
            and path.suffix in {"", ".py", ".md", ".toml", ".sh", ".yaml", ".yml", ".conf", ".xml"}
        )
    return sorted(path for path in found if path.is_file())


def citation_problems(root: Path) -> list[str]:
    """One line per citation of a file outside the repository, or of a missing ``docs/`` file."""
    found: list[str] = []
    for path in code_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        where = path.relative_to(root).as_posix()
        if where == "tests/unit/test_docs.py":  # its examples name missing files on purpose
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE.search(line):
                found.append(f"{where}:{number}: cites a file outside the repository")
            for cited in DOC_CITED.findall(line):
                if not (root / cited).is_file():
                    found.append(f"{where}:{number}: {cited} does not exist")
    return found


def test_the_repository_cites_only_what_it_contains() -> None:
    problems = citation_problems(ROOT)
    assert not problems, "citations of files that are not in the repository:\n" + "\n".join(
        problems
    )


def test_the_citation_check_finds_outside_and_missing_documents(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "platform.md").write_text("facts\n", encoding="utf-8")
    (tmp_path / "hydrator").mkdir()
    (tmp_path / "hydrator" / "a.py").write_text(
        '"""See docs/platform.md and docs/gone.md."""\n# recipe: shared/FACTS.md\n',
        encoding="utf-8",
    )
    assert citation_problems(tmp_path) == [
        "hydrator/a.py:1: docs/gone.md does not exist",
        "hydrator/a.py:2: cites a file outside the repository",
    ]


def unmapped_modules(root: Path) -> list[str]:
    """The modules of ``root``/hydrator (package files and ``__main__.py`` aside) whose file
    name docs/architecture.md never writes."""
    text = (root / "docs" / "architecture.md").read_text()
    skipped = {"__init__.py", "__main__.py"}
    return sorted(
        str(path.relative_to(root))
        for path in (root / "hydrator").rglob("*.py")
        if path.name not in skipped and path.name not in text
    )


def test_the_architecture_map_names_every_module() -> None:
    """A newcomer finds a module from the map: a module added or renamed without its line in
    docs/architecture.md fails here."""
    assert unmapped_modules(ROOT) == []


def test_the_map_check_finds_a_module_the_map_omits(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text("`core/plan.py` decides.\n")
    (tmp_path / "hydrator" / "core").mkdir(parents=True)
    for name in ("__init__.py", "plan.py", "guards.py"):
        (tmp_path / "hydrator" / "core" / name).write_text("")
    assert unmapped_modules(tmp_path) == ["hydrator/core/guards.py"]
