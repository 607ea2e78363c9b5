"""A real single-node Apache Kafka broker (KRaft, transactions on) on 127.0.0.1, run from Maven jars.

Besides its PLAINTEXT listener it can offer SASL_PLAINTEXT, and with TLS an SSL listener that requires
a client certificate (mTLS) and a SASL_SSL one, from a private CA made in its folder
(:mod:`.certificates`): the listeners a secured production cluster has, for both Kafka clients.

Used three ways: by ``fanout-sink stack up`` as a background daemon that outlives the command, by the
test suite as a session fixture, and by fault-injection tests that stop and restart it mid-run.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from fanout_sink import jars
from fanout_sink.devtools.stack.certificates import TlsFiles, make_tls_files
from fanout_sink.errors import StackError
from fanout_sink.kafka.java_client import jaas_quote
from fanout_sink.processes import pid_alive

KAFKA_BROKER = jars.JarSet("kafka-broker", "fanout_sink.devtools.stack")
"""Apache Kafka's server jars (``poms/kafka-broker.xml``)."""
READY_LINE = "Kafka Server started"
SASL_LISTENER = "SASL_CLIENT"
SSL_LISTENER = "SSL_CLIENT"
SASL_SSL_LISTENER = "SASL_SSL_CLIENT"
_PROTOCOLS = {SASL_LISTENER: "SASL_PLAINTEXT", SSL_LISTENER: "SSL", SASL_SSL_LISTENER: "SASL_SSL"}
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256")
_STATE_FILE = "broker.json"
_LOG_FILE = "broker.log"


@dataclass(frozen=True)
class BrokerState:
    """What a started broker leaves on disk so that another process can find, check or stop it."""

    pid: int
    port: int
    controller_port: int
    cluster_id: str
    data_dir: str
    log_file: str
    sasl_port: int | None = None
    ssl_port: int | None = None
    sasl_ssl_port: int | None = None
    tls_dir: str | None = None
    """The private CA and certificates (:class:`.certificates.TlsFiles`) when the broker has TLS."""

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def listener_ports(self) -> dict[str, int]:
        """The ports of the client listeners beyond PLAINTEXT, by listener name."""
        ports = {
            SASL_LISTENER: self.sasl_port,
            SSL_LISTENER: self.ssl_port,
            SASL_SSL_LISTENER: self.sasl_ssl_port,
        }
        return {name: port for name, port in ports.items() if port is not None}


@dataclass(frozen=True)
class SaslUser:
    """The one user a SASL broker accepts, by PLAIN and by SCRAM-SHA-256 (the password is not shown)."""

    username: str
    password: str = field(repr=False)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the broker's own listener: connections of a killed broker linger in TIME_WAIT, which
        # must not count as "taken" (without this, restart after kill() waits and then fails).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _usable(port: int | None, taken: tuple[int, ...]) -> int:
    """``port`` when it is free and not one of ``taken``, else a free port that is neither."""
    while port is None or port in taken or not port_is_free(port):
        port = free_port()
    return port


def _sasl_properties(user: SaslUser, listener: str) -> dict[str, str]:
    """A SASL listener's mechanisms and JAAS configs. PLAIN checks ``user_<name>`` entries of its
    JAAS config; SCRAM checks the credentials stored in the metadata log at format time."""
    prefix = f"listener.name.{listener.lower()}"
    plain = f"org.apache.kafka.common.security.plain.PlainLoginModule required user_{user.username}="
    return {
        f"{prefix}.sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
        f"{prefix}.plain.sasl.jaas.config": f"{plain}{jaas_quote(user.password)};",
        f"{prefix}.scram-sha-256.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
    }


def _tls_properties(files: TlsFiles) -> dict[str, str]:
    """PEM key and trust stores for the TLS listeners; the SSL one requires a client certificate, the
    SASL_SSL one authenticates by SASL (as clusters that offer both usually do)."""
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.server),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
        f"listener.name.{SSL_LISTENER.lower()}.ssl.client.auth": "required",
    }


def _escape_property(value: str) -> str:
    """A value for a Java properties file, where a backslash starts an escape."""
    return value.replace("\\", "\\\\")


def _new_cluster_id() -> str:
    while True:
        cid = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _diagnose(log_tail: str, port: int, controller_port: int) -> tuple[str, str]:
    """Turn the end of a failed broker's log into (cause, fix)."""
    if "Address already in use" in log_tail:
        return (
            f"the broker could not bind 127.0.0.1:{port} or :{controller_port}: the port is taken",
            "stop whatever holds it (`ss -ltnp`), or start on free ports (leave --port unset)",
        )
    if "UnsupportedClassVersionError" in log_tail:
        return ("the JVM on PATH is too old for Kafka 4", "put a Java 17+ `java` first on PATH")
    if "OutOfMemoryError" in log_tail or "Could not reserve enough space" in log_tail:
        return ("the broker's JVM ran out of memory", "free memory or lower FANOUT_SINK_BROKER_HEAP")
    if "meta.properties" in log_tail or "Invalid cluster.id" in log_tail or "cluster ID" in log_tail:
        return (
            "the broker's data folder belongs to another cluster",
            "delete the data folder named in the log (all local topics go with it) and start again",
        )
    return ("the Kafka broker exited during start-up", "read the broker log below for the Java error")


class KafkaBroker:
    """One broker process whose data, config and log live under ``work_dir``.

    Restarting keeps the data (topics, committed transactions, group offsets) and the ports, which
    is what fault-injection tests need to mimic a broker bounce.
    """

    def __init__(
        self,
        work_dir: Path,
        port: int | None = None,
        controller_port: int | None = None,
        sasl_user: SaslUser | None = None,
        properties: Mapping[str, str] | None = None,
        tls: bool = False,
        key_password: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        """``sasl_user`` adds a SASL_PLAINTEXT client listener (PLAIN and SCRAM-SHA-256) that accepts
        that user only; the PLAINTEXT listener stays for the controller, the broker itself and tools.
        ``tls`` adds an SSL listener that requires a certificate of the broker's private CA and, with
        ``sasl_user``, a SASL_SSL listener; the CA and certificates are made in ``work_dir/tls``, the
        client key encrypted with ``key_password`` (random if None).
        ``properties`` are server properties set last, over the defaults: a chaos run compresses a
        month of retention with ``offsets.retention.minutes`` and friends.
        ``host`` is the name the client listeners bind to and advertise: loopback, but in a container
        the service's name (``kafka``), which other containers resolve; the controller stays on loopback."""
        self.work_dir = work_dir.resolve()
        self.properties = dict(properties or {})
        self._requested_port = port
        self._requested_controller_port = controller_port
        self.sasl_user = sasl_user
        self.tls = tls
        self._key_password = key_password
        self.host = host
        self._process: subprocess.Popen[bytes] | None = None
        self.state: BrokerState | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self.state is None:
            raise StackError("the broker is not started", "call start() first")
        return self.state.bootstrap_servers

    @property
    def sasl_bootstrap_servers(self) -> str:
        """The SASL_PLAINTEXT listener's address (the broker was given a ``sasl_user``)."""
        return self._listener_address(SASL_LISTENER, "sasl_user=SaslUser(...)")

    @property
    def ssl_bootstrap_servers(self) -> str:
        """The SSL listener's address, which requires a client certificate (the broker has ``tls``)."""
        return self._listener_address(SSL_LISTENER, "tls=True")

    @property
    def sasl_ssl_bootstrap_servers(self) -> str:
        """The SASL_SSL listener's address (the broker has ``tls`` and a ``sasl_user``)."""
        return self._listener_address(SASL_SSL_LISTENER, "tls=True and sasl_user=SaslUser(...)")

    @property
    def tls_files(self) -> TlsFiles:
        """The private CA, the broker's and the client's certificates (the broker has ``tls``)."""
        if self.state is None or self.state.tls_dir is None:
            raise StackError("the broker has no TLS listener", "start it with tls=True")
        return TlsFiles(Path(self.state.tls_dir))

    def _listener_address(self, listener: str, how: str) -> str:
        port = None if self.state is None else self.state.listener_ports().get(listener)
        if port is None:
            raise StackError(f"the broker has no {_PROTOCOLS[listener]} listener", f"start it with {how}")
        return f"127.0.0.1:{port}"

    def _listeners(self) -> tuple[str, ...]:
        """The client listeners beyond PLAINTEXT that this broker offers."""
        wanted = {
            SASL_LISTENER: self.sasl_user is not None,
            SSL_LISTENER: self.tls,
            SASL_SSL_LISTENER: self.tls and self.sasl_user is not None,
        }
        return tuple(name for name, on in wanted.items() if on)

    @property
    def log_file(self) -> Path:
        return self.work_dir / _LOG_FILE

    @property
    def tls_dir(self) -> Path:
        return self.work_dir / "tls"

    def _choose_ports(self) -> tuple[int, int, dict[str, int]]:
        previous = load_state(self.work_dir)
        port = self._requested_port or (previous.port if previous else None)
        cport = self._requested_controller_port or (previous.controller_port if previous else None)
        for wanted, strict in ((port, self._requested_port is not None),
                               (cport, self._requested_controller_port is not None)):  # fmt: skip
            if wanted is not None and strict and not port_is_free(wanted):
                raise StackError(
                    f"port {wanted} on 127.0.0.1 is already taken",
                    f"stop the process holding it (`ss -ltnp 'sport = :{wanted}'`) or choose another port",
                )
        port = _usable(port, taken=())
        cport = _usable(cport, taken=(port,))
        before = previous.listener_ports() if previous else {}
        extra: dict[str, int] = {}
        for listener in self._listeners():
            extra[listener] = _usable(before.get(listener), taken=(port, cport, *extra.values()))
        return port, cport, extra

    def _write_config(self, port: int, cport: int, extra: Mapping[str, int]) -> Path:
        data_dir = self.work_dir / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        listeners = {"PLAINTEXT": port, "CONTROLLER": cport, **extra}
        protocols = {"CONTROLLER": "PLAINTEXT", "PLAINTEXT": "PLAINTEXT"}
        protocols.update({name: _PROTOCOLS[name] for name in extra})
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{cport}",
            "listeners": ",".join(
                f"{name}://{'127.0.0.1' if name == 'CONTROLLER' else self.host}:{p}"
                for name, p in listeners.items()
            ),
            "advertised.listeners": ",".join(
                f"{name}://{self.host}:{p}" for name, p in listeners.items() if name != "CONTROLLER"
            ),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(f"{name}:{p}" for name, p in protocols.items()),
            "log.dirs": str(data_dir),
            "num.partitions": "3",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "5",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # A broker restarted after a SIGKILL registers only once the controller (the same process,
            # started afresh) has expired the dead incarnation's session: 9 s by default, every time.
            "broker.heartbeat.interval.ms": "1000",
            "broker.session.timeout.ms": "4000",
            "log.cleaner.dedupe.buffer.size": "33554432",
            "log.flush.interval.messages": "9223372036854775807",
        }
        if self.sasl_user is not None:
            for listener in (SASL_LISTENER, SASL_SSL_LISTENER):
                if listener in extra:
                    props.update(_sasl_properties(self.sasl_user, listener))
        if self.tls:
            props.update(_tls_properties(make_tls_files(self.tls_dir, key_password=self._key_password)))
        props.update(self.properties)
        path = self.work_dir / "server.properties"
        path.write_text("".join(f"{k}={_escape_property(v)}\n" for k, v in props.items()))
        return path

    def start(self, timeout_s: float = 120.0) -> BrokerState:
        """Start the broker and return once it accepts clients; raise StackError within ``timeout_s``."""
        existing = load_state(self.work_dir)
        if existing is not None and pid_alive(existing.pid):
            raise StackError(
                f"a broker from {self.work_dir} is already running (pid {existing.pid}, "
                f"{existing.bootstrap_servers})",
                "use it, or stop it first (`fanout-sink stack down`)",
            )
        java = jars.require_tool(
            "java", "install a JDK 17 (Debian: `apt-get install -y openjdk-17-jdk-headless`)"
        )
        classpath = str(jars.fetch(KAFKA_BROKER) / "*")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        port, cport, extra = self._choose_ports()
        config = self._write_config(port, cport, extra)
        cluster_id = existing.cluster_id if existing else _new_cluster_id()
        scram = []
        if self.sasl_user is not None:
            user = self.sasl_user
            scram = ["--add-scram", f"SCRAM-SHA-256=[name={user.username},password={user.password}]"]
        log4j = resources.files("fanout_sink.devtools.stack").joinpath("log4j2-broker.properties")
        jvm = [java, f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        if not (self.work_dir / "data" / "meta.properties").exists():  # a restart keeps its storage
            self._format(jvm, config, cluster_id, scram, port, cport)
        heap = os.environ.get("FANOUT_SINK_BROKER_HEAP", "1g")
        log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                [*jvm, "-Xms256m", f"-Xmx{heap}", "-XX:+UseG1GC", "kafka.Kafka", str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.work_dir,
            )  # fmt: skip
        self.state = BrokerState(
            pid=self._process.pid, port=port, controller_port=cport, cluster_id=cluster_id,
            data_dir=str(self.work_dir / "data"), log_file=str(self.log_file),
            sasl_port=extra.get(SASL_LISTENER), ssl_port=extra.get(SSL_LISTENER),
            sasl_ssl_port=extra.get(SASL_SSL_LISTENER), tls_dir=str(self.tls_dir) if self.tls else None,
        )  # fmt: skip
        self._wait_ready(log_offset, timeout_s)
        (self.work_dir / _STATE_FILE).write_text(json.dumps(asdict(self.state), indent=2) + "\n")
        return self.state

    def _format(
        self, jvm: list[str], config: Path, cluster_id: str, scram: list[str], port: int, cport: int
    ) -> None:
        """Format new storage (a JVM of its own: seconds on a loaded box, so a restart skips it;
        ``--ignore-formatted`` would make it a no-op there, SCRAM credentials included)."""
        fmt = subprocess.run(
            [*jvm, "-Xmx256m", "kafka.tools.StorageTool", "format", "-t", cluster_id,
             "-c", str(config), "--ignore-formatted", *scram],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if fmt.returncode != 0:
            tail = "\n".join((fmt.stdout + fmt.stderr).strip().splitlines()[-15:])
            cause, fix = _diagnose(tail, port, cport)
            raise StackError(f"formatting the broker storage failed: {cause}", fix, tail)

    def _wait_ready(self, log_offset: int, timeout_s: float) -> None:
        assert self._process is not None and self.state is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.log_file.open("rb") as log:
                log.seek(log_offset)
                if READY_LINE.encode() in log.read():
                    return
            if self._process.poll() is not None:
                tail = log_tail(self.log_file)
                cause, fix = _diagnose(tail, self.state.port, self.state.controller_port)
                raise StackError(
                    f"{cause} (exit code {self._process.returncode})",
                    fix,
                    f"last lines of {self.log_file}:\n{tail}",
                )
            time.sleep(0.2)
        self.kill()
        raise StackError(
            f"the Kafka broker did not report ready within {timeout_s:.0f}s",
            "the machine may be overloaded; read the broker log, then retry",
            f"last lines of {self.log_file}:\n{log_tail(self.log_file)}",
        )

    def exit_code(self) -> int | None:
        """How the process this object started ended (negative: the signal), None while it runs or
        before a start: a long test run asks this to tell a dead broker from a slow one."""
        return None if self._process is None else self._process.poll()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Clean shutdown (SIGTERM); SIGKILL if it does not exit in time."""
        if self.state is not None:
            stop_pid(self.state.pid, timeout_s)
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=1)
        self._process = None

    def kill(self) -> None:
        """SIGKILL, as a crash would: in-flight transactions are left for the restarted broker to resolve."""
        if self.state is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.state.pid, signal.SIGKILL)
        if self._process is not None:
            self._process.wait(timeout=30)
        self._process = None

    def restart(self, timeout_s: float = 120.0, away_s: float = 0.0) -> BrokerState:
        """Stop and start again on the same ports with the same data, ``away_s`` seconds later."""
        assert self.state is not None
        self._requested_port = self.state.port
        self._requested_controller_port = self.state.controller_port
        self.stop()
        time.sleep(away_s)
        deadline = time.monotonic() + 30
        while not (port_is_free(self.state.port) and port_is_free(self.state.controller_port)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return self.start(timeout_s)


def load_state(work_dir: Path) -> BrokerState | None:
    path = work_dir / _STATE_FILE
    try:
        return BrokerState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def stop_pid(pid: int, timeout_s: float = 30.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def is_running(state: BrokerState) -> bool:
    """The broker's process lives and its port accepts connections."""
    if not pid_alive(state.pid):
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", state.port)) == 0
