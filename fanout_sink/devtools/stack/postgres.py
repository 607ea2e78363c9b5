"""PostgreSQL on 127.0.0.1 from the system's packages, for the SQL catalog that teams run on a shared
database (SQLite is embedded-only: one process, one host).

One cluster per work dir (initdb on first start), one user with a password (clients get a URI that
carries it) and one database ``iceberg``. PostgreSQL refuses to run as root, so as root the server,
and its data folder, belong to the ``postgres`` OS user the Debian package creates.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from fanout_sink.devtools.stack.service import LOCALHOST, LocalServer, pick_port
from fanout_sink.errors import StackError
from fanout_sink.processes import run_or_raise

DATABASE = "iceberg"
USER = "fanout"
PASSWORD_ENV = "FANOUT_SINK_POSTGRES_PASSWORD"
OS_USER = "postgres"
"""Who runs the server when this process is root."""


@dataclass(frozen=True)
class PostgresState:
    """Where the server listens and how to log in (the password is not shown in reprs)."""

    pid: int
    port: int
    log_file: str
    data_dir: str
    user: str
    password: str = field(repr=False)
    database: str = DATABASE
    host: str = "127.0.0.1"

    @property
    def sqlalchemy_uri(self) -> str:
        """The ``uri`` of PyIceberg's SQL catalog on this database (psycopg2 driver)."""
        return (
            f"postgresql+psycopg2://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
            f"@{self.host}:{self.port}/{self.database}"
        )

    @property
    def jdbc_url(self) -> str:
        """The same database for JDBC clients (the login goes separately: ``user``, ``password``)."""
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.database}"


def bin_dir() -> Path:
    """The newest installed PostgreSQL's programs (Debian keeps them off PATH, one folder per version);
    as root on Debian, the package is installed when missing, as the broker's jars are fetched."""
    found = _installed_bin_dir()
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        result = subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"],
            capture_output=True, text=True, timeout=900, check=False,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )  # fmt: skip
        found = _installed_bin_dir()
        if found is None:
            raise StackError(
                "PostgreSQL is not installed and `apt-get install -y postgresql` failed",
                "run `apt-get update && apt-get install -y postgresql` and read its error",
                "\n".join((result.stdout + result.stderr).strip().splitlines()[-10:]),
            )
    if found is None:
        raise StackError(
            "PostgreSQL's server programs (initdb, postgres) were not found",
            "install them (Debian: `apt-get install -y postgresql`) and retry",
        )
    return found


def _installed_bin_dir() -> Path | None:
    found = sorted(
        (Path(path).parent for path in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1]
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb is not None else None


class PostgresServer(LocalServer[PostgresState]):
    """A PostgreSQL cluster under ``work_dir`` (or, as root, in a ``postgres``-owned folder linked from
    it); data survives a kill: PostgreSQL replays its WAL at the next start."""

    kind = "postgres"
    title = "PostgreSQL server"
    state_type = PostgresState
    stop_signal = signal.SIGINT  # "fast" shutdown: SIGTERM's "smart" one waits for every client to leave

    def _launch(self, previous: PostgresState | None) -> PostgresState:
        programs = bin_dir()
        port = pick_port(self.requested_port, previous.port if previous else None)
        data_dir = self._data_dir()
        password = previous.password if previous else None
        password = password or os.environ.get(PASSWORD_ENV) or secrets.token_urlsafe(18)
        if not (data_dir / "PG_VERSION").exists():
            self._initdb(programs, data_dir, password)
        if self.host != LOCALHOST:
            _allow_remote_logins(data_dir)
        pid = self._spawn(
            [*_as_server_user(), str(programs / "postgres"), "-D", str(data_dir), "-p", str(port),
             "-h", self.host, "-k", str(data_dir)]
        )  # fmt: skip
        return PostgresState(
            pid=pid, port=port, log_file=str(self.log_file), data_dir=str(data_dir), user=USER,
            password=password,
        )  # fmt: skip

    def discard(self) -> None:
        """Stop the server and delete its cluster: as root the data lives outside the work dir (see
        ``_data_dir``), where deleting the work dir does not reach it."""
        self.stop()
        local = self.work_dir / "pgdata"
        data = local.resolve()
        if local.is_symlink():
            local.unlink()
        shutil.rmtree(data, ignore_errors=True)

    def _data_dir(self) -> Path:
        local = self.work_dir / "pgdata"
        if os.geteuid() != 0:
            local.mkdir(mode=0o700, exist_ok=True)
            return local
        # The work dir may sit in a folder only root can enter (pytest's /tmp/pytest-of-root is 0700).
        digest = hashlib.sha256(str(self.work_dir).encode()).hexdigest()[:12]
        data = Path(tempfile.gettempdir()) / f"fanout-sink-postgres-{digest}"
        data.mkdir(mode=0o700, exist_ok=True)
        shutil.chown(data, OS_USER, OS_USER)
        if not local.is_symlink():
            local.symlink_to(data)
        return data

    def _initdb(self, programs: Path, data_dir: Path, password: str) -> None:
        pwfile = data_dir.parent / f".{data_dir.name}.pw"
        pwfile.touch(mode=0o600)
        pwfile.write_text(password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, OS_USER, OS_USER)
        try:
            # Passwords over TCP (scram), trust on the socket inside the data folder: only its owner
            # can reach that, and it is how the database is created below.
            run_or_raise(
                [*_as_server_user(), str(programs / "initdb"), "-D", str(data_dir), "-U", USER,
                 f"--pwfile={pwfile}", "--auth-host=scram-sha-256", "--auth-local=trust",
                 "-E", "UTF8", "--locale=C.UTF-8"],
                f"initdb could not create a PostgreSQL cluster in {data_dir}",
                "read initdb's output below; an unusable half-made folder can be deleted",
                timeout_s=300, tail_lines=15,
            )  # fmt: skip
        finally:
            pwfile.unlink(missing_ok=True)

    def _ready(self, state: PostgresState) -> bool:
        result = subprocess.run(
            [str(bin_dir() / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(state.port)],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        return result.returncode == 0

    def start(self, timeout_s: float = 120.0) -> PostgresState:
        state = super().start(timeout_s)
        create_database(state, state.database)
        return state


def create_database(state: PostgresState, name: str) -> PostgresState:
    """Create database ``name`` on the running server unless it exists (over the socket in the data
    folder, so only its owner can); the state of a client of that database."""
    result = subprocess.run(
        [str(bin_dir() / "createdb"), "-h", state.data_dir, "-p", str(state.port),
         "-U", state.user, name],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if result.returncode != 0 and "already exists" not in result.stderr:
        raise StackError(
            f"creating the database {name!r} failed", "read createdb's error below", result.stderr
        )
    return dataclasses.replace(state, database=name)


def _allow_remote_logins(data_dir: Path) -> None:
    """Password logins from any address (a container's neighbours), besides initdb's 127.0.0.1 only."""
    hba = data_dir / "pg_hba.conf"
    line = "host all all all scram-sha-256\n"
    if line not in hba.read_text():
        with hba.open("a") as conf:
            conf.write(line)


def _as_server_user() -> list[str]:
    """The prefix that runs a PostgreSQL program as the ``postgres`` OS user when we are root (it
    refuses root); setpriv execs, so the pid we keep is the server's own and SIGKILL reaches it."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise StackError(
            "PostgreSQL cannot run as root and `setpriv` (util-linux) is missing",
            "install util-linux, or start the stack as an ordinary user",
        )
    return [setpriv, f"--reuid={OS_USER}", f"--regid={OS_USER}", "--init-groups", "--"]
