"""The import boundaries between the layers (docs/design.md, "Layers"), read from the source
with ``ast`` (nothing is imported).

- ``kernel`` imports nothing from ``messaging`` or ``swiftlets``;
- ``messaging`` imports nothing from ``kernel`` or ``swiftlets``;
- a swiftlet imports ``martinet.kernel…``, ``martinet.messaging…``, its own package, and of
  another swiftlet only its ``api`` module — never its ``__init__``, config or implementation;
- nothing imports the bare top-level names ``kernel``, ``messaging`` or ``swiftlets``
  (installed, they are ``martinet.kernel`` and so on; alone they name other distributions).

Imports under ``if TYPE_CHECKING:`` and inside functions count as well. Relative imports
are resolved against the importing module's package first.

The shape of a swiftlet folder is checked too: its ``__init__.py`` holds the spec and the
hooks only (``martinet_swiftlets`` and other ``martinet_*`` hooks, such as the scheduler
jobs it offers), and config classes live in its ``config.py``.

And the shape of ``tests/`` (docs/development.md, "Tests"): no test file at its top (each lives in the
folder of what it tests), none in ``tests/harness`` (helpers only), an ``__init__.py`` in every
folder of Python files (pytest then imports each file by its full dotted name, so two folders
may hold files of the same name), and no module imports from ``conftest`` (it declares
fixtures; the helpers are ``tests.harness``).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.harness.paths import ROOT

LAYERS = ("kernel", "messaging", "swiftlets")
BARE = frozenset(LAYERS)


@attrs.frozen
class Import:
    """One imported module, as the file names it and as it resolves."""

    path: Path
    line: int
    text: str  # the import statement as written (first line)
    module: str  # absolute dotted name of the module imported (or imported from)
    names: tuple[str, ...] = ()  # for ``from module import a, b``

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.text}"


def module_name(path: Path) -> str:
    """``martinet.swiftlets.jms.listener`` for swiftlets/jms/listener.py (``__init__``: the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("martinet", *parts))


def package_of(path: Path) -> str:
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports(path: Path) -> Iterator[Import]:
    source = path.read_text()
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, lines[node.lineno - 1].strip(), alias.name)
        elif isinstance(node, ast.ImportFrom):
            text = lines[node.lineno - 1].strip()
            names = tuple(alias.name for alias in node.names)
            if node.level:
                base = package_of(path).split(".")
                if node.level - 1 >= len(base):
                    raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno}: {text}: beyond the top package")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield Import(path, node.lineno, text, module, names)


def sources() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violation(imp: Import) -> str | None:
    """Why ``imp`` breaks a boundary, or None."""
    top = imp.module.split(".")[0]
    if top in BARE:
        return f"imports the bare top-level name {top!r}: use martinet.{imp.module}"
    layer = imp.path.relative_to(ROOT).parts[0]
    if layer == "kernel":
        for other in ("martinet.messaging", "martinet.swiftlets"):
            if within(imp.module, other):
                return f"the kernel imports {imp.module}: the kernel knows nothing about messaging or swiftlets"
        return None
    if layer == "messaging":
        for other in ("martinet.kernel", "martinet.swiftlets"):
            if within(imp.module, other):
                return f"messaging imports {imp.module}: messaging imports nothing of ours but itself"
        return None
    # a swiftlet (or the swiftlets namespace package itself)
    if (
        not within(imp.module, "martinet")
        or within(imp.module, "martinet.kernel")
        or within(imp.module, "martinet.messaging")
    ):
        return None
    parts = imp.path.relative_to(ROOT).parts
    own = f"martinet.swiftlets.{parts[1]}" if len(parts) > 2 else None
    if own is not None and within(imp.module, own):
        return None
    if not within(imp.module, "martinet.swiftlets") or imp.module == "martinet.swiftlets":
        return (
            f"imports {imp.module or 'martinet'}: a swiftlet imports martinet.kernel, martinet.messaging, "
            "its own package and other swiftlets' api modules"
        )
    other = ".".join(imp.module.split(".")[:3])
    if imp.module == f"{other}.api":
        return None
    if imp.module == other and imp.names == ("api",):  # from martinet.swiftlets.x import api
        return None
    return f"imports {imp.module}, the inside of swiftlet {other.rpartition('.')[2]}: import {other}.api instead"


def test_every_layer_keeps_to_its_imports():
    problems = [
        f"{imp.where()}  -- {why}" for path in sources() for imp in imports(path) if (why := violation(imp)) is not None
    ]
    assert not problems, 'import boundaries broken (docs/design.md, "Layers"):\n' + "\n".join(problems)


def test_the_checker_catches_what_it_should(tmp_path, monkeypatch):
    """The rules above, on made-up files: each bad import is reported with file:line."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    files = {
        "kernel/boot.py": "from martinet.messaging import codec\n",
        "messaging/codec.py": "import trio\nfrom martinet.kernel import Router\n",
        "swiftlets/jms/listener.py": (
            "from martinet.swiftlets.queuemanager.api import QueueError\n"
            "from martinet.swiftlets.queuemanager import QueueManager\n"
            "from martinet.swiftlets.topicmanager.hierarchy import parse_topic\n"
            "from martinet.swiftlets.authentication import api\n"
            "from .config import JmsConfig\n"
            "from ..store.sqlite import SqliteStore\n"
            "import kernel\n"
            "def f():\n    from swiftlets.log import handler\n"
        ),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = [
        f"{imp.where()}  -- {why}" for path in sources() for imp in imports(path) if (why := violation(imp)) is not None
    ]
    assert found == [
        "kernel/boot.py:1: from martinet.messaging import codec  -- the kernel imports martinet.messaging: "
        "the kernel knows nothing about messaging or swiftlets",
        "messaging/codec.py:2: from martinet.kernel import Router  -- messaging imports martinet.kernel: "
        "messaging imports nothing of ours but itself",
        "swiftlets/jms/listener.py:2: from martinet.swiftlets.queuemanager import QueueManager  -- imports "
        "martinet.swiftlets.queuemanager, the inside of swiftlet queuemanager: import "
        "martinet.swiftlets.queuemanager.api instead",
        "swiftlets/jms/listener.py:3: from martinet.swiftlets.topicmanager.hierarchy import parse_topic  -- "
        "imports martinet.swiftlets.topicmanager.hierarchy, the inside of swiftlet topicmanager: import "
        "martinet.swiftlets.topicmanager.api instead",
        "swiftlets/jms/listener.py:6: from ..store.sqlite import SqliteStore  -- imports "
        "martinet.swiftlets.store.sqlite, the inside of swiftlet store: import martinet.swiftlets.store.api "
        "instead",
        "swiftlets/jms/listener.py:7: import kernel  -- imports the bare top-level name 'kernel': use martinet.kernel",
        "swiftlets/jms/listener.py:9: from swiftlets.log import handler  -- imports the bare top-level name "
        "'swiftlets': use martinet.swiftlets.log",
    ]


# -- the shape of a swiftlet folder ------------------------------------------------------------


def swiftlet_folders() -> list[Path]:
    return sorted(p for p in (ROOT / "swiftlets").iterdir() if (p / "__init__.py").exists())


def is_config_class(node: ast.ClassDef) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "config_class")
        or (isinstance(d, ast.Attribute) and d.attr == "config_class")
        for d in node.decorator_list
    )


@pytest.mark.parametrize("folder", swiftlet_folders(), ids=lambda p: p.name)
def test_a_swiftlet_init_holds_only_its_spec_and_hook(folder):
    init = folder / "__init__.py"
    source = init.read_text()
    tree, lines = ast.parse(source, str(init)), source.splitlines()
    extra = []
    hooks = []
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the module docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.FunctionDef) and node.name.startswith("martinet_"):
            hooks.append(node.name)  # its hooks: martinet_swiftlets, and e.g. the jobs it offers
            continue
        extra.append(f"{init.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert hooks.count("martinet_swiftlets") == 1, f"{init.relative_to(ROOT)}: one martinet_swiftlets hook expected"
    assert not extra, "a swiftlet's __init__.py holds its spec and hook only; move these to a module:\n" + "\n".join(
        extra
    )


def test_config_classes_live_in_config_modules():
    misplaced = []
    for folder in swiftlet_folders():
        for path in sorted(folder.rglob("*.py")):
            if path.name == "config.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef) and is_config_class(node):
                    misplaced.append(f"{path.relative_to(ROOT)}:{node.lineno}: class {node.name}")
    assert not misplaced, "@config_class classes belong in the swiftlet's config.py:\n" + "\n".join(misplaced)


# Folders of Python files under tests/ that are not packages: sitecustomize.py is put on a
# child process's PYTHONPATH by its folder, never imported from here.
NOT_PACKAGES = frozenset({Path("tests/harness/sparkfaults")})


def python_files(top: Path) -> list[Path]:
    return sorted(p for p in top.rglob("*.py") if not {"__pycache__", "node_modules"} & set(p.parts))


def misplaced_tests(root: Path) -> list[str]:
    """What breaks the layout of ``root/tests``, one line each."""
    tests = root / "tests"
    found = [f"{p.relative_to(root)}: a test file at the top of tests/" for p in sorted(tests.glob("test_*.py"))]
    found += [f"{p.relative_to(root)}: a test file among the helpers" for p in (tests / "harness").rglob("test_*.py")]
    folders = {p.parent for p in python_files(tests)}
    found += [
        f"{folder.relative_to(root)}: no __init__.py"
        for folder in sorted(folders)
        if folder.relative_to(root) not in NOT_PACKAGES and not (folder / "__init__.py").exists()
    ]
    return found


def conftest_imports(root: Path) -> list[str]:
    """Every import of a conftest module under ``root/tests``, as ``path:line``."""
    found = []
    for path in python_files(root / "tests"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                modules = [base] + [f"{base}.{alias.name}".lstrip(".") for alias in node.names]
            else:
                continue
            if any(module.split(".")[-1] == "conftest" for module in modules):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_test_files_live_in_the_folders_of_what_they_test():
    assert not misplaced_tests(ROOT), "\n".join(misplaced_tests(ROOT))


def test_no_module_imports_from_conftest():
    assert not conftest_imports(ROOT), "import these from tests.harness:\n" + "\n".join(conftest_imports(ROOT))


def test_the_test_layout_checks_catch_what_they_should(tmp_path):
    tests = tmp_path / "tests"
    (tests / "harness").mkdir(parents=True)
    (tests / "kernel").mkdir()
    for path in (tests / "__init__.py", tests / "harness" / "__init__.py"):
        path.write_text("")
    (tests / "conftest.py").write_text("from tests.harness.polling import wait_until\n")
    (tests / "test_stray.py").write_text("from conftest import wait_until\n")
    (tests / "harness" / "test_helper.py").write_text("import conftest\n")
    (tests / "kernel" / "test_bus.py").write_text("from tests.conftest import drain\nfrom . import conftest\n")
    assert misplaced_tests(tmp_path) == [
        "tests/test_stray.py: a test file at the top of tests/",
        "tests/harness/test_helper.py: a test file among the helpers",
        "tests/kernel: no __init__.py",
    ]
    assert conftest_imports(tmp_path) == [
        "tests/harness/test_helper.py:1",
        "tests/kernel/test_bus.py:1",
        "tests/kernel/test_bus.py:2",
        "tests/test_stray.py:1",
    ]
