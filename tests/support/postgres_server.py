"""A real PostgreSQL server for the tests of a sweep shared through ``--storage``: started in a temporary folder on a
free port of 127.0.0.1, stopped and started again at will (a database restart between runs), removed at the end.

PostgreSQL refuses to run as root: as root, the server runs as the unprivileged system user ``postgres`` (Debian's
postgresql package creates it; ``.ci/run`` installs the package where the binaries are missing), through
``runuser``. ``find_server`` says why no server can be started where none can."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

SERVER_USER = "postgres"  # the unprivileged user a root process runs the server as


def find_server() -> tuple[Path | None, str]:
    """The folder of ``initdb`` and ``pg_ctl``, or None and why not."""
    found = shutil.which("initdb")
    folders = [Path(found).parent] if found else []
    folders += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    folder = next((f for f in folders if (f / "initdb").is_file() and (f / "pg_ctl").is_file()), None)
    if folder is None:
        return None, "PostgreSQL's initdb and pg_ctl are not installed (apt-get install postgresql; .ci/run does)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return None, f"running as root, and no unprivileged user {SERVER_USER!r} to run PostgreSQL as"
        if shutil.which("runuser") is None:
            return None, "running as root, and no runuser to run PostgreSQL as an unprivileged user"
    return folder, ""


class PostgresServer:
    """One server, its data in a temporary folder: ``url`` while it runs; ``stop`` and ``start`` for a restart."""

    def __init__(self, binaries: Path) -> None:
        self.binaries = binaries
        self.folder = Path(tempfile.mkdtemp(prefix="hf-geonorm-postgres-"))
        self.data = self.folder / "data"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"postgresql://geonorm@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.folder, user.pw_uid, user.pw_gid)
        self.run("initdb", "--no-sync", "-A", "trust", "-U", "geonorm", "-D", str(self.data))
        self.start()

    def run(self, program: str, *args: str) -> None:
        prefix = ["runuser", "-u", SERVER_USER, "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, str(self.binaries / program), *args], capture_output=True, text=True,
                              cwd=self.folder, timeout=120)  # fmt: skip
        assert done.returncode == 0, f"{program} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.folder / "server.log"), "-w", "start")

    def add_user_with_password(self, user: str, password: str) -> str:
        """A role that must log in with ``password`` (every other role is trusted): its URL, without the password.
        The rule is put first in pg_hba.conf (which the server owner's files hold; root writes it as that user)."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(f"CREATE ROLE {user} SUPERUSER LOGIN PASSWORD '{password}'")
        rules = self.data / "pg_hba.conf"
        rules.write_text(f"host all {user} 127.0.0.1/32 scram-sha-256\n" + rules.read_text())
        self.run("pg_ctl", "-D", str(self.data), "reload")
        return f"postgresql://{user}@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        try:
            self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except AssertionError:
            pass  # already stopped
        shutil.rmtree(self.folder, ignore_errors=True)
