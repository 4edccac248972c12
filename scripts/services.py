#!/usr/bin/env python3
"""Real PostgreSQL and Apache Kafka servers for Sapwood's tests and CI.

Usage::

    python scripts/services.py install   # PostgreSQL binaries, Kafka broker jars, Chromium (idempotent)
    python scripts/services.py start     # start both, wait until they really answer
    python scripts/services.py env       # print the `export` lines for the tests
    python scripts/services.py status    # what is running (exit 1 if something is down)
    python scripts/services.py stop      # SIGTERM both, wait, remove their data

The servers run natively (no container engine needed):

* PostgreSQL: ``initdb -A trust`` on a fresh directory under the system temp dir
  (owned by the ``postgres`` user when we run as root, since the server refuses
  to run as root), listening on 127.0.0.1 on a free port.
* Kafka: one combined broker+controller (KRaft) on loopback, run from the
  broker jars that ``install`` copies from Maven Central into a cache dir
  (``~/.cache/sapwood/kafka-<version>/libs``; ``SAPWOOD_CACHE_DIR`` moves the
  base ``~/.cache/sapwood``).

``start`` writes ``.services/state.json`` (pids, ports, directories and the
exact Kafka command line) and ``.services/env`` (shell ``export`` lines). Tests
use ``tests/support/services.py``, which imports this file, to stop and restart
the broker on the same ports and log dir.

Environment: ``SAPWOOD_CACHE_DIR`` (jar cache base), ``SAPWOOD_SERVICES_DIR``
(state dir, default ``<repo>/.services``), ``SAPWOOD_PG_BIN`` (PostgreSQL bin
dir), ``SAPWOOD_PG_DURABLE=1`` (keep fsync on; the default turns it off, as
suits throw-away test servers but not benchmarks).

Only the standard library is needed to install, start and stop; the readiness
checks use psycopg and kafka-python (project dependencies) when importable.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import glob
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
SLF4J_VERSION = "2.0.17"
KAFKA_JVM_OPTS = ["-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-XX:ActiveProcessorCount=2"]
TOOL_JVM_OPTS = ["-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0

REPO_ROOT = Path(__file__).resolve().parents[1]


class ServiceError(RuntimeError):
    """A service could not be installed, started or stopped; the message says why."""


# --------------------------------------------------------------------------- paths


def services_dir() -> Path:
    """Where state, env file and logs live (``<repo>/.services`` unless SAPWOOD_SERVICES_DIR)."""
    return Path(os.environ.get("SAPWOOD_SERVICES_DIR", REPO_ROOT / ".services")).resolve()


def state_path() -> Path:
    return services_dir() / "state.json"


def env_path() -> Path:
    return services_dir() / "env"


def cache_base() -> Path:
    return Path(os.environ.get("SAPWOOD_CACHE_DIR", Path.home() / ".cache" / "sapwood")).expanduser()


def kafka_libs_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_base() / f"kafka-{version}" / "libs"


def _log(msg: str) -> None:
    print(f"[services] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=False, text=True, capture_output=True, **kwargs)


# --------------------------------------------------------------------------- state


def load_state(path: Path | None = None) -> dict[str, Any]:
    path = path or state_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ServiceError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def save_state(state: dict[str, Any], path: Path | None = None) -> None:
    path = path or state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def env_vars(state: dict[str, Any]) -> dict[str, str]:
    """The variables tests read, derived from the state written by ``start``."""
    out: dict[str, str] = {"SAPWOOD_TEST_SERVICES_STATE": str(state_path())}
    pg = state.get("postgres")
    if pg:
        out.update(
            SAPWOOD_TEST_DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:{pg['port']}/postgres",
            SAPWOOD_TEST_PG_BIN=pg["bin_dir"],
            SAPWOOD_TEST_PG_DATA=pg["data_dir"],
            SAPWOOD_TEST_PG_PORT=str(pg["port"]),
            SAPWOOD_TEST_PG_SOCKET_DIR=pg["socket_dir"],
        )
    kafka = state.get("kafka")
    if kafka:
        out.update(
            SAPWOOD_TEST_KAFKA_BOOTSTRAP=f"127.0.0.1:{kafka['port']}",
            SAPWOOD_TEST_KAFKA_CONTROLLER_PORT=str(kafka["controller_port"]),
            SAPWOOD_TEST_KAFKA_CONFIG=kafka["config"],
            SAPWOOD_TEST_KAFKA_LOG_DIR=kafka["log_dir"],
        )
    return out


def env_lines(state: dict[str, Any]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env_vars(state).items())


def write_env(state: dict[str, Any]) -> None:
    env_path().write_text(env_lines(state))


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def pid_alive(pid: int | None) -> bool:
    """True while ``pid`` runs (a zombie child of ours counts as exited and is reaped)."""
    if not pid:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _pid_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


def terminate(pid: int, *, timeout: float = STOP_TIMEOUT_S, expect: str | None = None) -> None:
    """SIGTERM ``pid`` and wait; SIGKILL if it outlives ``timeout``.

    ``expect`` guards against a recycled pid: a process whose command line lacks
    it is left alone.
    """
    if not pid_alive(pid):
        return
    if expect and _pid_cmdline(pid) and expect not in _pid_cmdline(pid):
        _log(f"pid {pid} is no longer {expect!r}; not signalling it")
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_exit(pid, timeout):
        return
    _log(f"pid {pid} ignored SIGTERM for {timeout:.0f}s; sending SIGKILL")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_exit(pid, 10)


def _tail(path: str | Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------- PostgreSQL


def find_pg_bin() -> Path | None:
    """The directory holding ``initdb``/``pg_ctl``: SAPWOOD_PG_BIN, Debian's newest, or PATH."""
    override = os.environ.get("SAPWOOD_PG_BIN")
    if override:
        return Path(override) if (Path(override) / "initdb").exists() else None
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb") or shutil.which("pg_ctl")
    return Path(found).resolve().parent if found else None


def _apt_install(*packages: str) -> None:
    if shutil.which("apt-get") is None:
        raise ServiceError(f"install {' '.join(packages)} with your system's package manager")
    if os.geteuid() != 0:
        raise ServiceError(f"run as root, or install {' '.join(packages)} yourself (apt-get install -y ...)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    _log(" ".join(cmd))
    if _run(cmd, env=env).returncode == 0:
        return
    _log("apt-get install failed; refreshing the package lists (apt-get update) and retrying")
    update = _run(["apt-get", "update"], env=env)
    if update.returncode != 0:
        raise ServiceError(f"apt-get update failed:\n{update.stderr[-2000:]}")
    again = _run(cmd, env=env)
    if again.returncode != 0:
        raise ServiceError(f"apt-get install {' '.join(packages)} failed:\n{again.stderr[-2000:]}")


def install_postgres() -> Path:
    bin_dir = find_pg_bin()
    if bin_dir is not None:
        _log(f"PostgreSQL present: {bin_dir}")
        return bin_dir
    _apt_install("postgresql")
    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise ServiceError("postgresql installed but initdb not found")
    return bin_dir


def _as_pg_user(cmd: list[str]) -> list[str]:
    """Run as the ``postgres`` user when we are root (the server refuses root)."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--", *cmd]
    return ["su", "-s", "/bin/sh", "postgres", "-c", shlex.join(cmd)]


def _pg_owner() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam("postgres")
    except KeyError as exc:
        raise ServiceError("no 'postgres' user: install the postgresql package (services.py install)") from exc
    return entry.pw_uid, entry.pw_gid


def _pg_ready(port: int, timeout: float) -> None:
    """Wait until a real connection runs ``SELECT 1``."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    try:
        import psycopg
    except ImportError:
        psycopg = None  # type: ignore[assignment]
    while time.monotonic() < deadline:
        try:
            if psycopg is not None:
                conninfo = f"host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=3"
                with psycopg.connect(conninfo) as conn:
                    conn.execute("SELECT 1").fetchone()
                return
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return
        except Exception as exc:
            last = exc
            time.sleep(0.2)
    raise ServiceError(f"PostgreSQL on port {port} not ready after {timeout:.0f}s: {last}")


def start_postgres() -> dict[str, Any]:
    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise ServiceError("PostgreSQL binaries not found: run `python scripts/services.py install`")
    root = Path(tempfile.mkdtemp(prefix="sapwood-pg-"))
    data_dir, socket_dir = root / "data", root / "sock"
    socket_dir.mkdir()
    owner = _pg_owner()
    if owner is not None:
        for path in (root, socket_dir):
            os.chown(path, *owner)
    os.chmod(root, 0o700)
    log_file = root / "postgres.log"
    init = _run(
        _as_pg_user(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data_dir),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
    )
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise ServiceError(f"initdb failed:\n{init.stdout[-2000:]}\n{init.stderr[-2000:]}")
    port = free_port()
    durable = os.environ.get("SAPWOOD_PG_DURABLE", "") not in ("", "0")
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {socket_dir} -c max_connections=200"
    if not durable:  # throw-away test server: skip fsyncs (SAPWOOD_PG_DURABLE=1 keeps them, for benchmarks)
        opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    started = _run(
        _as_pg_user(
            [str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-l", str(log_file), "-o", opts, "-w", "-t", "60", "start"]
        )
    )
    if started.returncode != 0:
        tail = _tail(log_file)
        shutil.rmtree(root, ignore_errors=True)
        raise ServiceError(f"pg_ctl start failed:\n{started.stdout[-2000:]}\n{started.stderr[-2000:]}\n{tail}")
    pid_line = (data_dir / "postmaster.pid").read_text().splitlines()[0]
    state = {
        "pid": int(pid_line),
        "port": port,
        "bin_dir": str(bin_dir),
        "root": str(root),
        "data_dir": str(data_dir),
        "socket_dir": str(socket_dir),
        "log": str(log_file),
        "durable": durable,
    }
    try:
        _pg_ready(port, READY_TIMEOUT_S)
    except BaseException:
        stop_postgres(state)
        raise
    return state


def stop_postgres(pg: dict[str, Any]) -> None:
    data_dir = Path(pg["data_dir"])
    if data_dir.exists() and pid_alive(pg.get("pid")):
        result = _run(
            _as_pg_user(
                [str(Path(pg["bin_dir"]) / "pg_ctl"), "-D", str(data_dir), "-m", "fast", "-w", "-t", "60", "stop"]
            )
        )
        if result.returncode != 0:
            _log(f"pg_ctl stop failed ({result.stderr.strip()}); sending SIGTERM")
            terminate(int(pg["pid"]), expect="postgres")
    elif pid_alive(pg.get("pid")):
        terminate(int(pg["pid"]), expect="postgres")
    log_file = Path(pg.get("log", ""))
    if log_file.is_file():
        with contextlib.suppress(OSError):
            shutil.copyfile(log_file, services_dir() / "postgres.log")
    shutil.rmtree(pg["root"], ignore_errors=True)


def restart_postgres_process(pg: dict[str, Any]) -> int:
    """``pg_ctl restart -m fast`` on the same data dir and port (drops every connection)."""
    result = _run(
        _as_pg_user(
            [
                str(Path(pg["bin_dir"]) / "pg_ctl"),
                "-D",
                pg["data_dir"],
                "-l",
                pg["log"],
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
                "restart",
            ]
        )
    )
    if result.returncode != 0:
        raise ServiceError(f"pg_ctl restart failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    pg["pid"] = int((Path(pg["data_dir"]) / "postmaster.pid").read_text().splitlines()[0])
    _pg_ready(int(pg["port"]), READY_TIMEOUT_S)
    return int(pg["pid"])


# --------------------------------------------------------------------------- Kafka

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.sapwood</groupId>
  <artifactId>kafka-broker-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{kafka}</version>
    </dependency>
    <!-- kafka's POM ships no SLF4J provider (KAFKA-18466) -->
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>{slf4j}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-simple</artifactId>
      <version>{slf4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ServiceError("java not found: run `python scripts/services.py install`")
    return found


def _java_major() -> int:
    out = _run([_java(), "-version"]).stderr
    for token in out.replace('"', " ").split():
        head = token.split(".")[0].split("-")[0]
        if head.isdigit() and "." in token:
            major = int(head)
            return int(token.split(".")[1]) if major == 1 else major
    return 0


def install_kafka(version: str = KAFKA_VERSION) -> Path:
    libs = kafka_libs_dir(version)
    marker = libs / ".complete"
    if marker.exists() and any(libs.glob(f"kafka_{SCALA_VERSION}-{version}.jar")):
        _log(f"Kafka {version} jars present: {libs}")
        return libs
    if shutil.which("java") is None or _java_major() < 17:
        _apt_install("openjdk-17-jre-headless")
    if shutil.which("mvn") is None:
        _apt_install("maven")
    work = libs.parent / "build"
    work.mkdir(parents=True, exist_ok=True)
    pom = work / "pom.xml"
    pom.write_text(_POM.format(scala=SCALA_VERSION, kafka=version, slf4j=SLF4J_VERSION))
    staging = libs.parent / "libs.partial"
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        "mvn",
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    _log(f"downloading Kafka {version} broker jars with Maven into {libs}")
    result = _run(cmd)
    if result.returncode != 0:
        raise ServiceError(f"mvn failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    if not any(staging.glob(f"kafka_{SCALA_VERSION}-{version}.jar")):
        raise ServiceError(f"mvn succeeded but kafka_{SCALA_VERSION}-{version}.jar is missing in {staging}")
    shutil.rmtree(libs, ignore_errors=True)
    staging.replace(libs)
    (libs / ".complete").write_text("\n".join(sorted(p.name for p in libs.glob("*.jar"))) + "\n")
    return libs


def kafka_properties(port: int, controller_port: int, log_dir: Path) -> str:
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "4",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        "num.network.threads": "2",
        "num.io.threads": "4",
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _kafka_classpath(libs: Path) -> str:
    return f"{libs}/*"


def kafka_command(kafka: dict[str, Any]) -> list[str]:
    """The broker's command line, stored in the state so a restart runs the same thing."""
    return [
        _java(),
        *KAFKA_JVM_OPTS,
        "-Djava.awt.headless=true",
        "-Dorg.slf4j.simpleLogger.showDateTime=true",
        "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
        "-cp",
        _kafka_classpath(Path(kafka["libs"])),
        "kafka.Kafka",
        kafka["config"],
    ]


def _kafka_ready(bootstrap: str, timeout: float, pid: int, log: str) -> None:
    """Wait until an admin ``list_topics()`` succeeds (an open port is not readiness)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from kafka import KafkaAdminClient
    except ImportError:
        KafkaAdminClient = None
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            raise ServiceError(f"Kafka exited during start-up; log tail ({log}):\n{_tail(log)}")
        try:
            if KafkaAdminClient is None:
                with socket.create_connection(("127.0.0.1", int(bootstrap.rsplit(":", 1)[1])), timeout=2):
                    return
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
                try:
                    admin.list_topics()
                finally:
                    admin.close()
            return
        except Exception as exc:
            last = exc
            time.sleep(0.5)
    raise ServiceError(f"Kafka at {bootstrap} not ready after {timeout:.0f}s: {last}\n{_tail(log)}")


def launch_kafka(kafka: dict[str, Any]) -> int:
    """Start the broker from its recorded config, wait until ready, return its pid."""
    for port in (kafka["port"], kafka["controller_port"]):
        deadline = time.monotonic() + 30
        while not port_is_free(port) and time.monotonic() < deadline:
            time.sleep(0.2)
    cmd = kafka_command(kafka)
    with open(kafka["log"], "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=kafka["dir"],
            start_new_session=True,
        )
    kafka["pid"] = proc.pid
    kafka["command"] = cmd
    try:
        _kafka_ready(f"127.0.0.1:{kafka['port']}", READY_TIMEOUT_S, proc.pid, kafka["log"])
    except BaseException:
        terminate(proc.pid, timeout=20)
        kafka["pid"] = None
        raise
    return proc.pid


def start_kafka() -> dict[str, Any]:
    libs = kafka_libs_dir()
    if not (libs / ".complete").exists():
        raise ServiceError(f"Kafka jars not in {libs}: run `python scripts/services.py install`")
    kdir = services_dir() / "kafka"
    shutil.rmtree(kdir, ignore_errors=True)
    log_dir = kdir / "data"
    log_dir.mkdir(parents=True)
    port, controller_port = free_port(), free_port()
    while controller_port == port:
        controller_port = free_port()
    config = kdir / "server.properties"
    config.write_text(kafka_properties(port, controller_port, log_dir))
    cluster_id = new_cluster_id()
    fmt = _run(
        [
            _java(),
            *TOOL_JVM_OPTS,
            "-cp",
            _kafka_classpath(libs),
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",
            "-c",
            str(config),
        ],
        cwd=kdir,
    )
    if fmt.returncode != 0:
        raise ServiceError(f"kafka StorageTool format failed:\n{fmt.stdout[-3000:]}\n{fmt.stderr[-3000:]}")
    kafka: dict[str, Any] = {
        "version": KAFKA_VERSION,
        "libs": str(libs),
        "dir": str(kdir),
        "config": str(config),
        "log_dir": str(log_dir),
        "log": str(kdir / "kafka.log"),
        "port": port,
        "controller_port": controller_port,
        "cluster_id": cluster_id,
    }
    launch_kafka(kafka)
    return kafka


def new_cluster_id() -> str:
    """A random 22-character cluster id, as Kafka's own tool makes them.

    Like Kafka's ``Uuid.randomUuid`` it never starts with ``-``: the storage tool's argument
    parser would read such an id as an option (one start in 64 failed that way).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def stop_kafka_process(kafka: dict[str, Any]) -> None:
    """SIGTERM the broker and wait (its log dir stays, so it can start again)."""
    pid = kafka.get("pid")
    if pid:
        terminate(int(pid), expect="kafka.Kafka")
    kafka["pid"] = None


def restart_kafka_process(kafka: dict[str, Any]) -> int:
    """Stop the broker, start it again on the same ports and log dir, wait until ready."""
    stop_kafka_process(kafka)
    return launch_kafka(kafka)


# --------------------------------------------------------------------------- commands


def install_chromium() -> str:
    """Headless Chromium for the web viewer's browser tests (Debian's ``chromium`` package)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            _log(f"Chromium present: {found}")
            return found
    _apt_install("chromium")
    found = shutil.which("chromium")
    if found is None:
        raise ServiceError("chromium installed but not on PATH")
    return found


def cmd_install() -> None:
    t0 = time.monotonic()
    install_postgres()
    install_kafka()
    install_chromium()
    _log(f"install done in {time.monotonic() - t0:.1f}s")


def cmd_start() -> None:
    t0 = time.monotonic()
    services_dir().mkdir(parents=True, exist_ok=True)
    state = load_state()
    pg, kafka = state.get("postgres"), state.get("kafka")
    if pg and not pid_alive(pg.get("pid")):
        stop_postgres(pg)
        pg = None
    if kafka and not pid_alive(kafka.get("pid")):
        kafka = None
    state = {"postgres": pg, "kafka": kafka}
    try:
        if pg is None:
            t = time.monotonic()
            state["postgres"] = start_postgres()
            _log(f"PostgreSQL ready on 127.0.0.1:{state['postgres']['port']} in {time.monotonic() - t:.1f}s")
            save_state(state)
        else:
            _log(f"PostgreSQL already running on 127.0.0.1:{pg['port']}")
        if kafka is None:
            t = time.monotonic()
            state["kafka"] = start_kafka()
            _log(f"Kafka ready on 127.0.0.1:{state['kafka']['port']} in {time.monotonic() - t:.1f}s")
        else:
            _log(f"Kafka already running on 127.0.0.1:{kafka['port']}")
    finally:
        save_state(state)
        write_env(state)
    _log(f"start done in {time.monotonic() - t0:.1f}s; env in {env_path()}")


def cmd_stop() -> None:
    state = load_state()
    kafka, pg = state.get("kafka"), state.get("postgres")
    if kafka:
        stop_kafka_process(kafka)
        shutil.rmtree(Path(kafka["log_dir"]), ignore_errors=True)
        _log("Kafka stopped")
    if pg:
        stop_postgres(pg)
        _log("PostgreSQL stopped")
    if state_path().exists():
        state_path().unlink()
    if env_path().exists():
        env_path().unlink()


def cmd_status() -> int:
    state = load_state()
    ok = True
    pg, kafka = state.get("postgres"), state.get("kafka")
    if pg and pid_alive(pg.get("pid")):
        print(
            f"postgres: running pid={pg['pid']} port={pg['port']} data={pg['data_dir']} "
            f"durable={pg.get('durable', False)}"
        )
    else:
        ok = False
        print("postgres: not running")
    if kafka and pid_alive(kafka.get("pid")):
        print(
            f"kafka: running pid={kafka['pid']} port={kafka['port']} "
            f"controller_port={kafka['controller_port']} version={kafka['version']}"
        )
    else:
        ok = False
        print("kafka: not running")
    return 0 if ok else 1


def cmd_env() -> int:
    state = load_state()
    if not state:
        _log("nothing started: run `python scripts/services.py start`")
        return 1
    sys.stdout.write(env_lines(state))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("command", choices=["install", "start", "stop", "status", "env"])
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            cmd_install()
        elif args.command == "start":
            cmd_start()
        elif args.command == "stop":
            cmd_stop()
        elif args.command == "status":
            return cmd_status()
        elif args.command == "env":
            return cmd_env()
    except ServiceError as exc:
        _log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
