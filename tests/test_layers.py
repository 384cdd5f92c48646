"""The app's packages import one another only along the arrows of docs/architecture.md:
core, audio and engine are Qt-free and headless; the engine knows nothing of profiles, jobs,
the studio or the CLI; nothing of the product imports the developer tools."""

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "app"
QT = ("PySide6", "pyqtgraph", "shiboken6")
# What each package may not import (the packages above it, and Qt where it is headless).
FORBIDDEN = {
    "core": (*QT, "app.engine", "app.models", "app.profiles", "app.jobs", "app.ui", "app.cli"),
    "audio": (*QT, "app.engine", "app.models", "app.profiles", "app.jobs", "app.ui", "app.cli"),
    "engine": (*QT, "app.profiles", "app.jobs", "app.ui", "app.cli"),
    "models": (*QT, "app.profiles", "app.jobs", "app.ui", "app.cli"),
    "profiles": (*QT, "app.jobs", "app.ui", "app.cli"),
    "jobs": ("app.ui", "app.cli"),
    "cli": (*QT, "app.ui", "app.jobs"),
    "ui": ("app.cli",),
}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_above_it(package):
    files = sorted((APP / package).rglob("*.py"))
    assert files, package
    wrong = [
        f"{path.relative_to(APP.parent)} imports {name}"
        for path in files
        for name in sorted(imported_modules(path))
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[package])
    ]
    assert wrong == []


def test_the_product_imports_no_developer_tools_but_benchs_comparison():
    users = sorted(
        str(path.relative_to(APP.parent))
        for path in APP.rglob("*.py")
        if any(name.startswith("tools") for name in imported_modules(path))
    )
    assert users == ["app/cli/bench.py"]  # bench --compare onnxruntime, imported when asked for
