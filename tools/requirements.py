"""Print the pinned requirements from pyproject.toml (build, runtime, and the given extras)."""

import sys
from pathlib import Path

import tomllib

project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8"))
lines = list(project["build-system"]["requires"]) + list(project["project"]["dependencies"])
for extra in sys.argv[1:]:
    lines += project["project"]["optional-dependencies"][extra]
print("\n".join(lines))
