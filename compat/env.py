"""Idempotent setup of the non-Python clients: the Java client's jars, the Java driver, kafkajs, kcat.

Called once per run by compat/conftest.py (and by compat/setup.sh).  Nothing prebuilt is committed:

* the Java client (``kafka-clients`` 3.9.0) and its runtime dependencies (slf4j-api, lz4-java,
  snappy-java, zstd-jni) plus Jackson for the driver's JSON come from Maven Central:
  ``mvn dependency:copy-dependencies`` on ``compat/java/pom.xml`` copies them into ``compat/.cache/jars``
  (Maven keeps the artifacts in ``~/.m2``);
* ``compat/java/CompatDriver.java`` (and the fault campaign's ``tests/nemesis/java/NemesisClient.java``) is
  compiled with the machine's JDK into ``compat/.cache/java/<program>/<source hash>/``;
* kafkajs comes from npm (``npm ci`` in ``compat/js`` against the committed lock file);
* the Go drivers (``compat/go/<client>/main.go``: franz-go, Sarama, kafka-go) are built with the machine's
  Go from the Go module proxy at the versions their committed ``go.mod``/``go.sum`` pin, into
  ``compat/.cache/go/<client>/<source hash>/driver``; Go keeps its module and build caches where it always
  does (``~/go/pkg/mod``, ``~/.cache/go-build``), so a CI can cache them;
* kcat is the Debian package (``apt-get install kcat``; scripts/install.sh --test does it).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

COMPAT = Path(__file__).resolve().parent
CACHE = COMPAT / ".cache"
JARS_DIR = CACHE / "jars"
JS_DIR = COMPAT / "js"
JAVA_SRC = COMPAT / "java" / "CompatDriver.java"
GO_DIR = COMPAT / "go"
# The Go drivers: client name -> directory under compat/go (each its own module; compat/go/rpc is shared).
GO_DRIVERS = {"franz-go": "franz", "sarama": "sarama", "kafka-go": "kafkago"}
JAVA_POM = COMPAT / "java" / "pom.xml"
JARS_COMPLETE = ".complete"  # written last: the POM's hash, then the jar names
# What the driver cannot run without; the POM names the versions.
REQUIRED_JARS = ("kafka-clients-3.9.0.jar", "jackson-databind-")


class SetupError(RuntimeError):
    pass


@contextmanager
def dir_lock(directory: Path, name: str) -> Iterator[None]:
    """An exclusive lock on ``directory/.name.lock``: one test worker (or setup.sh) prepares what the
    others then reuse."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(args: list[str], cwd: Path | None = None, timeout: float = 600) -> None:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SetupError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def _cached_jars() -> list[Path] | None:
    """The jars of the last complete copy, or None when it is missing, partial or from another POM."""
    try:
        digest, *names = (JARS_DIR / JARS_COMPLETE).read_text().split()
    except (OSError, ValueError):
        return None
    found = [JARS_DIR / n for n in names]
    if digest != hashlib.sha256(JAVA_POM.read_bytes()).hexdigest() or not all(p.is_file() for p in found):
        return None
    return found


def jars() -> list[Path]:
    """The Java client's classpath, copied from Maven Central by ``mvn`` on first use."""
    with dir_lock(CACHE, "jars"):
        found = _cached_jars()
        if found is not None:
            return found
        mvn = shutil.which("mvn")
        if mvn is None:
            raise SetupError("the Java client's jars come from Maven Central with mvn: apt-get install maven "
                             "(scripts/install.sh --test installs it)")
        tmp = CACHE / "jars.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        _run([mvn, "-q", "-B", "-f", str(JAVA_POM), "dependency:copy-dependencies", "-DincludeScope=runtime",
              f"-DoutputDirectory={tmp}"])
        got = sorted(tmp.glob("*.jar"))
        missing = [r for r in REQUIRED_JARS if not any(p.name.startswith(r) for p in got)]
        if missing:
            raise SetupError(f"mvn copied {[p.name for p in got]} from {JAVA_POM}, without {missing}")
        digest = hashlib.sha256(JAVA_POM.read_bytes()).hexdigest()
        (tmp / JARS_COMPLETE).write_text("\n".join([digest, *(p.name for p in got)]) + "\n")
        shutil.rmtree(JARS_DIR, ignore_errors=True)
        tmp.rename(JARS_DIR)
        found = _cached_jars()
        if found is None:
            raise SetupError(f"the copy of the Java client's jars in {JARS_DIR} is incomplete")
        return found


def java_classpath() -> str:
    """Compile the Java driver (once per source version) and return the classpath to run it."""
    return compile_java(JAVA_SRC)


def compile_java(src: Path) -> str:
    """Compile the one-file Java program ``src`` against the Java client's jars, once per source version, into
    ``compat/.cache/java/<program>/<source hash>/``; the classpath to run it (its class is the file's stem)."""
    if not shutil.which("javac") or not shutil.which("java"):
        raise SetupError("the Java client needs a JDK (javac, java): apt-get install openjdk-17-jdk-headless")
    cp = os.pathsep.join(str(p) for p in jars())
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    top = CACHE / "java" / src.stem
    out = top / digest
    with dir_lock(CACHE, "javac"):
        if not (out / f"{src.stem}.class").exists():
            tmp = top / f"{digest}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            _run(["javac", "-nowarn", "-encoding", "UTF-8", "-cp", cp, "-d", str(tmp), str(src)])
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            for old in top.iterdir():  # builds of earlier versions of the program
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
    with dir_lock(CACHE, "npm"):
        if not (stamp.exists() and stamp.read_text() == want):
            _run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=JS_DIR)
            stamp.write_text(want)
    return nm


def go_binary() -> str:
    """The machine's Go: where scripts/install.sh puts the toolchain (and Go's own tarball does), else PATH."""
    path = "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else shutil.which("go")
    if not path:
        raise SetupError("the Go clients need Go: scripts/install.sh --test installs it")
    return path


def _go_sources(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == ".go" or p.name in ("go.mod", "go.sum"))


def go_driver(client: str) -> Path:
    """Build the Go driver of ``client`` (once per source version: its own files and compat/go/rpc's)
    and return the binary."""
    src = GO_DIR / GO_DRIVERS[client]
    h = hashlib.sha256()
    for p in _go_sources(src) + _go_sources(GO_DIR / "rpc"):
        h.update(str(p.relative_to(GO_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    digest = h.hexdigest()[:16]
    top = CACHE / "go" / GO_DRIVERS[client]
    out = top / digest / "driver"
    with dir_lock(top, "build"):
        if not out.exists():
            tmp = top / f"{digest}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            # GOTOOLCHAIN=local: the machine's Go or a clear failure, never a toolchain download;
            # -mod=readonly: exactly the committed go.sum.
            env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly -buildvcs=false"}
            proc = subprocess.run([go_binary(), "build", "-o", str(tmp / "driver"), "."], cwd=src,
                                  capture_output=True, text=True, timeout=900, env=env)
            if proc.returncode != 0:
                raise SetupError(f"go build in {src} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
            shutil.rmtree(top / digest, ignore_errors=True)
            tmp.rename(top / digest)
            for old in top.iterdir():  # builds of earlier versions of the driver
                if old.name != digest and not old.name.startswith("."):
                    shutil.rmtree(old, ignore_errors=True)
    return out


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
        **{f"go {c}": str(go_driver(c)) for c in GO_DRIVERS},
        "kcat": kcat(),
    }


if __name__ == "__main__":
    for k, v in setup_all().items():
        print(f"{k}: {v}")
