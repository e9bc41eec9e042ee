"""Tests for bai/common/dburl.py (where the manager's database is, from `[manager] database` or
`bai node --database`), its check in the configuration, and `bai config show` keeping passwords off the screen.
No database server is needed: the PostgreSQL DSNs are read back with libpq's own parser (psycopg)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from bai.common import config
from bai.common.config import ConfigError
from bai.common.dburl import DatabaseLocation, DatabaseURLError, check, locate, redact

SECRET = "s3cr3t:/@?&=% pw"  # characters a URL must escape


def libpq(where: DatabaseLocation) -> dict[str, object]:
    """The DSN as libpq reads it."""
    return dict(conninfo_to_dict(where.dsn))


def never_shows(where: DatabaseLocation, secret: str) -> None:
    for text in (where.shown, repr(where), str(where), where.password_from):
        assert secret not in text


# -- SQLite --------------------------------------------------------------------------------------------------


def test_empty_is_the_embedded_file_in_the_state_dir(tmp_path: Path) -> None:
    where = locate("", tmp_path)
    assert where.engine == "sqlite" and where.path == tmp_path / "bai.db"
    assert where.dsn == str(tmp_path / "bai.db")
    assert where.shown == f"sqlite://{tmp_path}/bai.db"
    assert locate("   ", tmp_path) == where


def test_sqlite_url_and_plain_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = locate("sqlite:///srv/bai/state.db", tmp_path)
    assert where.engine == "sqlite" and where.path == Path("/srv/bai/state.db")
    assert where.shown == "sqlite:///srv/bai/state.db"
    assert locate("SQLite:///srv/my%20db.db", tmp_path).path == Path("/srv/my db.db")
    assert locate("/srv/bai/other.db", tmp_path).path == Path("/srv/bai/other.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert locate("rel/x.db", Path("/elsewhere")).path == tmp_path / "rel" / "x.db"  # from the working directory
    assert locate("~/x.db", Path("/elsewhere")).path == tmp_path / "home" / "x.db"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("sqlite://host/x.db", "three slashes"),
        ("sqlite:///x.db?mode=ro", "no parameters"),
        ("sqlite:///", "names no file"),
    ],
)
def test_bad_sqlite_urls(tmp_path: Path, value: str, says: str) -> None:
    with pytest.raises(DatabaseURLError, match=says):
        locate(value, tmp_path)


# -- PostgreSQL ------------------------------------------------------------------------------------------


def test_postgresql_url_without_password(tmp_path: Path) -> None:
    where = locate("postgresql://bai@db1:5432/bai", tmp_path, {})
    assert where.engine == "postgresql" and where.path is None
    assert where.shown == "postgresql://bai@db1:5432/bai" and where.password_from == ""
    assert libpq(where) == {"user": "bai", "host": "db1", "port": "5432", "dbname": "bai"}
    # postgres:// is the same; the default port is shown, the DSN keeps what the URL says
    other = locate("postgres://bai@db1/bai", tmp_path, {})
    assert other.shown == "postgresql://bai@db1:5432/bai"
    assert libpq(other) == {"user": "bai", "host": "db1", "dbname": "bai"}


def test_no_host_is_libpqs_default_socket(tmp_path: Path) -> None:
    where = locate("postgresql:///bai", tmp_path, {})
    assert libpq(where) == {"dbname": "bai"}  # no host, no user: libpq's defaults (socket, PGHOST, OS user)
    assert where.shown == "postgresql:///bai"
    socket = locate("postgresql://bai@%2Fvar%2Frun%2Fpostgresql/bai", tmp_path, {})
    assert libpq(socket)["host"] == "/var/run/postgresql"


def test_password_from_a_file_reaches_the_dsn_only(tmp_path: Path) -> None:
    secret_file = tmp_path / "pw"
    secret_file.write_text(SECRET + "\n")
    where = locate(f"postgresql://bai@db1/bai?password_file={secret_file}&sslmode=require", tmp_path, {})
    assert libpq(where) == {"user": "bai", "password": SECRET, "host": "db1", "dbname": "bai", "sslmode": "require"}
    assert where.shown == "postgresql://bai@db1:5432/bai?sslmode=require"
    assert where.password_from == f"file {secret_file}"
    never_shows(where, SECRET)
    never_shows(where, "s3cr3t")
    assert "dsn" not in repr(where)


def test_password_from_the_environment_reaches_the_dsn_only(tmp_path: Path) -> None:
    where = locate("postgresql://bai@db1:6432/bai?password_env=BAI_DB_PW", tmp_path, {"BAI_DB_PW": SECRET})
    assert libpq(where)["password"] == SECRET and libpq(where)["port"] == "6432"
    assert where.shown == "postgresql://bai@db1:6432/bai" and where.password_from == "environment BAI_DB_PW"
    never_shows(where, "s3cr3t")


def test_unreadable_password_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(DatabaseURLError) as e:
        locate(f"postgresql://bai@db1/bai?password_file={missing}", tmp_path, {})
    assert str(missing) in str(e.value) and "No such file" in str(e.value) and "\n" not in str(e.value)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(DatabaseURLError, match="is empty"):
        locate(f"postgresql://bai@db1/bai?password_file={empty}", tmp_path, {})


def test_missing_password_variable_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatabaseURLError, match="BAI_DB_PW.*is not set"):
        locate("postgresql://bai@db1/bai?password_env=BAI_DB_PW", tmp_path, {})
    with pytest.raises(DatabaseURLError, match="BAI_DB_PW.*is empty"):
        locate("postgresql://bai@db1/bai?password_env=BAI_DB_PW", tmp_path, {"BAI_DB_PW": ""})
    with pytest.raises(DatabaseURLError, match="keep one"):
        locate("postgresql://bai@db1/bai?password_env=A&password_file=/x", tmp_path, {"A": "a"})


def test_libpqs_own_password_sources_are_left_to_the_driver(tmp_path: Path) -> None:
    where = locate("postgresql://bai@db1/bai?passfile=/etc/bai/pgpass", tmp_path, {"PGPASSWORD": "x"})
    assert libpq(where) == {"user": "bai", "host": "db1", "dbname": "bai", "passfile": "/etc/bai/pgpass"}
    assert where.password_from == ""


@pytest.mark.parametrize(
    "value",
    [
        "postgresql://bai:hunter2@db1/bai",
        "postgres://bai:hunter2@db1:5432/bai?sslmode=require",
        "postgresql://:hunter2@db1/bai",
        "postgresql://bai:hun@ter2@db1/bai",
        "postgresql://bai@db1/bai?password=hunter2",
        "postgresql://bai@db1/bai?sslpassword=hunter2",
    ],
)
def test_a_password_in_the_url_is_refused_without_echoing_it(tmp_path: Path, value: str) -> None:
    with pytest.raises(DatabaseURLError) as e:
        locate(value, tmp_path, {})
    message = str(e.value)
    assert "password_file=" in message and "password_env=" in message
    assert "hunter2" not in message and "ter2" not in message
    with pytest.raises(DatabaseURLError):
        check(value)


def test_other_parameters_pass_through_and_bai_ones_do_not(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("p")
    value = (
        f"postgresql://bai@db1,db2:5433/bai?sslmode=verify-full&connect_timeout=5"
        f"&application_name=bai%20manager&target_session_attrs=read-write&password_file={pw}"
    )
    where = locate(value, tmp_path, {})
    got = libpq(where)
    assert got["host"] == "db1,db2" and got["port"] == ",5433"
    assert got["sslmode"] == "verify-full" and got["connect_timeout"] == "5"
    assert got["application_name"] == "bai manager" and got["target_session_attrs"] == "read-write"
    assert "password_file" not in where.dsn and "password_env" not in where.dsn
    assert where.shown.startswith("postgresql://bai@db1:5432,db2:5433/bai?sslmode=verify-full")


def test_percent_encoded_user_and_database(tmp_path: Path) -> None:
    where = locate("postgresql://b%40i%20ops@db1/my%2Fdb%20one?password_env=P", tmp_path, {"P": "x"})
    got = libpq(where)
    assert got["user"] == "b@i ops" and got["dbname"] == "my/db one" and got["password"] == "x"
    assert where.shown == "postgresql://b%40i%20ops@db1:5432/my%2Fdb%20one"


def test_ipv6_hosts(tmp_path: Path) -> None:
    where = locate("postgresql://bai@[::1]:5433/bai", tmp_path, {})
    assert libpq(where)["host"] == "::1" and libpq(where)["port"] == "5433"
    assert locate("postgresql://bai@[::1]/bai", tmp_path, {}).shown == "postgresql://bai@[::1]:5432/bai"


@pytest.mark.parametrize("value", ["mysql://u@h/db", "postgresql+asyncpg://u@h/db", "http://h/db"])
def test_an_unknown_scheme_names_the_ones_accepted(tmp_path: Path, value: str) -> None:
    with pytest.raises(DatabaseURLError) as e:
        locate(value, tmp_path, {})
    assert all(s in str(e.value) for s in ("sqlite://", "postgresql://", "postgres://", "plain path"))
    assert issubclass(DatabaseURLError, ValueError)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("postgresql://bai@db1:99999/bai", "port"),
        ("postgresql://bai@db1:x/bai", "port"),
        ("postgresql://bai@db1:/bai", "empty port"),
        ("postgresql://bai@db1/bai?sslmode=a&sslmode=b", "twice"),
        ("postgresql://bai@db1/a/b", "one database name"),
    ],
)
def test_malformed_postgresql_urls(tmp_path: Path, value: str, says: str) -> None:
    with pytest.raises(DatabaseURLError, match=says):
        locate(value, tmp_path, {})


# -- redact ------------------------------------------------------------------------------------------------


def test_redact_hides_passwords_in_free_text() -> None:
    line = 'connection to "postgresql://bai:hunter2@db1:5432/bai" failed; retry postgres://x:p@ss@h/d'
    out = redact(line)
    assert out == 'connection to "postgresql://bai:***@db1:5432/bai" failed; retry postgres://x:***@h/d'
    assert redact("dsn host=db1 password=hunter2 sslpassword='a b' user=bai") == (
        "dsn host=db1 password=*** sslpassword=*** user=bai"
    )
    plain = "postgresql://bai@db1/bai?password_file=/etc/pw http://example.com:8080/x"
    assert redact(plain) == plain


# -- the configuration and the CLI ---------------------------------------------------------------------------


def test_the_config_file_is_checked_without_reading_secrets(tmp_path: Path) -> None:
    assert config.DEFAULTS["manager"]["database"] == ""
    good = tmp_path / "good.toml"
    good.write_text('[manager]\ndatabase = "postgresql://bai@db1/bai?password_file=/no/such/file"\n')
    config.check({"manager": {"database": good.read_text().split('"')[1]}}, good)  # the file is read at start
    with pytest.raises(ConfigError) as e:
        config.check({"manager": {"database": "postgresql://bai:hunter2@db1/bai"}}, good)
    assert str(good) in str(e.value) and "[manager] database" in str(e.value) and "hunter2" not in str(e.value)
    with pytest.raises(ConfigError, match="mysql://"):
        config.check({"manager": {"database": "mysql://db1/bai"}}, good)


def bai(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`bai ARGS` with HOME, XDG dirs and the working directory in tmp_path."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("BAI_", "BACKEND_", "SORNA_", "XDG_", "PG"))}
    environ.update(
        HOME=str(tmp_path / "home"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        XDG_DATA_HOME=str(tmp_path / "data"),
        **env,
    )
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "bai", *args], env=environ, cwd=work, capture_output=True, text=True, timeout=90
    )


def test_config_show_tells_the_database_without_its_password(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("hunter2\n")
    cfg = tmp_path / "bai.toml"
    cfg.write_text(f'[manager]\ndatabase = "postgres://bai@db1/bai?password_file={pw}&sslmode=require"\n')
    out = bai(tmp_path, "config", "show", BAI_CONFIG=str(cfg))
    assert out.returncode == 0, out.stderr
    assert "hunter2" not in out.stdout + out.stderr
    assert f"#   manager database: postgresql://bai@db1:5432/bai?sslmode=require, password from file {pw}" in out.stdout
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("database = ")]
    assert line.startswith('database = "postgresql://bai@db1:5432/bai?sslmode=require"') and str(cfg) in line
    js = bai(tmp_path, "config", "show", "--json", BAI_CONFIG=str(cfg))
    assert js.returncode == 0 and "hunter2" not in js.stdout
    data = json.loads(js.stdout)
    assert data["config"]["manager"]["database"] == "postgresql://bai@db1:5432/bai?sslmode=require"
    assert data["database"] == {
        "engine": "postgresql",
        "shown": "postgresql://bai@db1:5432/bai?sslmode=require",
        "password_from": f"file {pw}",
        "error": "",
    }


def test_config_show_of_the_defaults_names_the_embedded_file(tmp_path: Path) -> None:
    out = bai(tmp_path, "config", "show")
    assert out.returncode == 0, out.stderr
    assert f"#   manager database: sqlite://{tmp_path}/data/bai/bai.db\n" in out.stdout
    assert 'database = ""' in out.stdout
    assert not (tmp_path / "data").exists()  # config show makes no state folder


def test_config_show_says_why_a_database_cannot_be_used_here(tmp_path: Path) -> None:
    cfg = tmp_path / "bai.toml"
    cfg.write_text('[manager]\ndatabase = "postgresql://bai@db1/bai?password_env=BAI_TEST_DB_PW"\n')
    out = bai(tmp_path, "config", "show", BAI_CONFIG=str(cfg))
    assert out.returncode == 0, out.stderr
    assert "not usable here: the database password's environment variable BAI_TEST_DB_PW" in out.stdout
    fine = bai(tmp_path, "config", "show", BAI_CONFIG=str(cfg), BAI_TEST_DB_PW="hunter2")
    assert "not usable here" not in fine.stdout and "hunter2" not in fine.stdout


def test_a_password_in_the_config_file_stops_config_show_without_printing_it(tmp_path: Path) -> None:
    cfg = tmp_path / "bai.toml"
    cfg.write_text('[manager]\ndatabase = "postgresql://bai:hunter2@db1/bai"\n')
    out = bai(tmp_path, "config", "show", BAI_CONFIG=str(cfg))
    assert out.returncode == 2
    assert "hunter2" not in out.stdout + out.stderr
    assert "password_file=" in out.stderr and str(cfg) in out.stderr


def test_node_has_a_database_flag(tmp_path: Path) -> None:
    out = bai(tmp_path, "node", "--help", COLUMNS="200")
    assert out.returncode == 0, out.stderr
    assert "--database" in out.stdout and "postgresql://" in out.stdout
