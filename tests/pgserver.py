"""A throwaway PostgreSQL server for the tests: Debian's own binaries (the `postgresql` package), a cluster of its
own in a fresh directory, listening on 127.0.0.1 at a free port, gone when the tests end.

`PostgresServer.start()` makes one (initdb, then postgres; as root both run as the `postgres` user, as
PostgreSQL refuses to run as root); `new_database()` gives each test a database of its own. Where no binaries
are installed, `available()` is False: tests that need the server skip, and fail under BAI_REQUIRE_POSTGRES=1
(CI sets it, as it sets BAI_REQUIRE_DOCKER).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.nodeproc import free_port

REQUIRED = os.environ.get("BAI_REQUIRE_POSTGRES") == "1"


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's bin directory (BAI_PG_BIN overrides), or None."""
    given = os.environ.get("BAI_PG_BIN")
    if given:
        return Path(given)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


def available() -> bool:
    where = bin_dir()
    return where is not None and (where / "initdb").exists()


class PostgresServer:
    """One running server (superuser `postgres`, trust authentication on 127.0.0.1 only)."""

    def __init__(self, root: Path, port: int, process: subprocess.Popen[bytes]) -> None:
        self.root = root
        self.port = port
        self.process = process
        self._names = itertools.count(1)

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    @classmethod
    def start(cls, durable: bool = False) -> PostgresServer:
        """A new server; `durable`: with fsync on (benchmarks' figures), else off (tests: faster, and a
        killed server still keeps what was committed, as the OS has it)."""
        where = bin_dir()
        if where is None:
            raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql)")
        root = Path(tempfile.mkdtemp(prefix="bai-pg-"))
        as_root = os.geteuid() == 0
        prefix: list[str] = ["runuser", "-u", "postgres", "--"] if as_root else []
        if as_root:
            shutil.chown(root, "postgres", "postgres")
        data = root / "data"
        subprocess.run(
            [*prefix, str(where / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
             "--locale=C", "--no-sync", "--no-instructions"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        for attempt in range(5):
            port = free_port()
            process = subprocess.Popen(
                [*prefix, str(where / "postgres"), "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1",
                 "-c", f"unix_socket_directories={root}", "-c", f"fsync={'on' if durable else 'off'}",
                 "-c", f"full_page_writes={'on' if durable else 'off'}", "-c", "max_connections=300",
                 "-c", "shared_buffers=64MB"],
                stdout=subprocess.DEVNULL, stderr=open(root / "server.log", "wb"),  # noqa: SIM115 (the server's)
            )  # fmt: skip
            server = cls(root, port, process)
            if server._wait_ready():
                return server
            server.stop(remove=False)
            if attempt == 4:
                raise RuntimeError(f"PostgreSQL did not start: {(root / 'server.log').read_text()[-2000:]}")
        raise AssertionError("unreachable")

    def _wait_ready(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False  # (the port was taken meanwhile: another try on another one)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.05)
                continue
            try:
                self.sql("SELECT 1")
                return True
            except Exception:  # noqa: BLE001 (starting up: the server says so until it accepts)
                time.sleep(0.05)
        return False

    def sql(self, statement: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True, connect_timeout=5) as conn:
            conn.execute(statement)  # type: ignore[arg-type]  # (the tests' own statements)

    def new_database(self, prefix: str = "t") -> str:
        """A new empty database's URL."""
        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        self.sql(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)

    def kill(self) -> None:
        """Stop the server at once (SIGKILL to the postmaster and its backends, as a crash of the machine would);
        `restart()` brings it back on the same port."""
        import signal

        import psutil

        pid_file = self.root / "data" / "postmaster.pid"
        pid = int(pid_file.read_text().split()[0])
        # its backends too: left to notice the postmaster's death, one may still answer a query (a loaded machine)
        backends = psutil.Process(pid).children(recursive=True)
        os.kill(pid, signal.SIGKILL)
        for child in backends:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(backends, timeout=10)
        self.process.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # (its backends end by themselves; the port is free once they have)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    pass
            except OSError:
                break
            time.sleep(0.05)
        if pid_file.exists():
            pid_file.unlink()

    def restart(self) -> None:
        where = bin_dir()
        assert where is not None
        prefix: list[str] = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.process = subprocess.Popen(
            [*prefix, str(where / "postgres"), "-D", str(self.root / "data"), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}", "-c", "fsync=off",
             "-c", "max_connections=300"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        if not self._wait_ready():
            raise RuntimeError("PostgreSQL did not start again")

    def stop(self, remove: bool = True) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)


_shared: PostgresServer | None = None


def shared() -> PostgresServer:
    """This test process's server (started at first use, stopped when the process ends); pytest.skip where
    PostgreSQL is not installed, a failure under BAI_REQUIRE_POSTGRES=1."""
    global _shared
    if _shared is None:
        if not available():
            import pytest

            if REQUIRED:
                pytest.fail("BAI_REQUIRE_POSTGRES=1 but PostgreSQL is not installed (apt-get install postgresql)")
            pytest.skip("PostgreSQL is not installed (apt-get install postgresql; CI requires it)")
        import atexit

        _shared = PostgresServer.start()
        atexit.register(_shared.stop)
    return _shared
