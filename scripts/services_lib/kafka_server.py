"""Native Kafka for the tests: broker jars from Maven Central, one KRaft broker+controller on loopback.

``install_kafka`` resolves the broker jars (and an SLF4J provider) with Maven into the cache dir;
``start_kafka`` formats a fresh log dir and launches ``kafka.Kafka`` with a recorded command line,
so a restart runs exactly the same broker on the same ports and log dir.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

from .common import (
    KAFKA_JVM_OPTS,
    KAFKA_VERSION,
    READY_TIMEOUT_S,
    SCALA_VERSION,
    SLF4J_VERSION,
    TOOL_JVM_OPTS,
    ServiceError,
    _apt_install,
    _log,
    _run,
)
from .processes import _tail, free_port, pid_alive, port_is_free, terminate
from .state import kafka_libs_dir, services_dir

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


def start_kafka(kdir: Path | None = None) -> dict[str, Any]:
    """Format a fresh broker in ``kdir`` (default ``<services dir>/kafka``), launch it, return its state."""
    libs = kafka_libs_dir()
    if not (libs / ".complete").exists():
        raise ServiceError(f"Kafka jars not in {libs}: run `python scripts/services.py install`")
    kdir = kdir or services_dir() / "kafka"
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
