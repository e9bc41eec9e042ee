"""Where the manager's database is: `[manager] database` (or `bai node --database`) read into a location.

"" is the embedded SQLite file `<state dir>/bai.db`; `sqlite:///ABS/PATH.db` or a plain path (`~` expanded,
a relative one taken from the working directory) is that SQLite file; `postgresql://USER@HOST:PORT/DB?…`
(or `postgres://`) is a PostgreSQL server, with libpq's defaults for what it leaves out (no host: the local
socket). A password never stands in the URL: `password_file=PATH` (the file's text, trailing newlines
dropped) or `password_env=NAME` (an environment variable) give it, or libpq's own PGPASSWORD / PGPASSFILE /
~/.pgpass, which the driver reads. Other query parameters (sslmode, connect_timeout, application_name, …)
go to the driver as they are.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, quote, unquote, urlencode

SCHEMES = ("sqlite", "postgresql", "postgres")
# query parameters bai reads itself (never passed to the driver)
BAI_PARAMETERS = ("password_file", "password_env")
# query parameters that would put a secret in the URL (libpq would take them)
SECRET_PARAMETERS = ("password", "sslpassword")
DEFAULT_PORT = 5432
EMBEDDED_FILE = "bai.db"

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# scheme://user:password@ in free text (the password runs to the last @ before a / or a blank)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*):[^\s/]*@")
# libpq's key=value conninfo: password=… or sslpassword=… (quoted or not)
_KEYWORD = re.compile(r"(?<![\w])((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'\"]+)")


class DatabaseURLError(ValueError):
    """A database setting bai cannot use; the message is one line and holds no password."""


@dataclass(frozen=True)
class DatabaseLocation:
    """Where the manager's database is.

    `dsn` is what the driver opens: for SQLite the file's path, for PostgreSQL a libpq URI with the password
    (when bai read one) -- never to be printed; `shown` is for logs, banners and `bai config show` and never
    holds a password; `password_from` says where the password comes from ("file PATH", "environment NAME" or
    "" for libpq's own PGPASSWORD / PGPASSFILE / ~/.pgpass).
    """

    engine: Literal["sqlite", "postgresql"]
    path: Path | None
    dsn: str = field(repr=False)
    shown: str
    password_from: str = ""

    def __str__(self) -> str:
        return self.shown


def redact(text: str) -> str:
    """`text` with any password of a `scheme://user:password@` (and a libpq `password=…`) replaced by ***."""
    text = _USERINFO.sub(r"\1:***@", text)
    return _KEYWORD.sub(r"\1***", text)


def locate(value: str, state_dir: Path, environ: Mapping[str, str] = os.environ) -> DatabaseLocation:
    """The database that `value` (`[manager] database`) names, its password (if given) read into `dsn`.

    Raises DatabaseURLError (one line, no password in it) for a scheme bai does not know, a password
    written in the URL, or a password file or variable that cannot be read.
    """
    return _parse(value, state_dir, environ, read_password=True)


def check(value: str) -> None:
    """Raise DatabaseURLError if `value` cannot name a database, whatever the machine (no file is read)."""
    _parse(value, Path("/"), {}, read_password=False)


def _parse(value: str, state_dir: Path, environ: Mapping[str, str], *, read_password: bool) -> DatabaseLocation:
    value = value.strip()
    if not value:
        return _sqlite(Path(state_dir) / EMBEDDED_FILE)
    match = _URL.match(value)
    if match is None:
        return _sqlite(Path(value).expanduser().absolute())
    scheme = match.group(1).lower()
    if scheme not in SCHEMES:
        raise DatabaseURLError(
            f"database URL scheme {match.group(1)}:// is not known: use sqlite:///PATH, a plain path, "
            f"or postgresql:// (also postgres://)"
        )
    rest = value[match.end() :]
    if scheme == "sqlite":
        return _sqlite_url(rest)
    return _postgresql(value, rest, environ, read_password)


def _sqlite(path: Path) -> DatabaseLocation:
    return DatabaseLocation(engine="sqlite", path=path, dsn=str(path), shown=f"sqlite://{path}")


def _sqlite_url(rest: str) -> DatabaseLocation:
    if "?" in rest or "#" in rest:
        raise DatabaseURLError("a sqlite:// database URL takes no parameters: write sqlite:///ABSOLUTE/PATH.db")
    if not rest.startswith("/"):
        raise DatabaseURLError(
            f"sqlite://{rest} names a host: write sqlite:///ABSOLUTE/PATH.db (three slashes) or a plain path"
        )
    path = Path(unquote(rest))
    if path == Path("/"):
        raise DatabaseURLError("sqlite:/// names no file: write sqlite:///ABSOLUTE/PATH.db")
    return _sqlite(path)


def _postgresql(value: str, rest: str, environ: Mapping[str, str], read_password: bool) -> DatabaseLocation:
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise DatabaseURLError(f"a database URL has no #fragment: {redact(value)}")
    rest, _, query = rest.partition("?")
    netloc, slash, dbname = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if ":" in userinfo:
        raise DatabaseURLError(
            f"the database URL holds a password ({redact(value)}): put it in a file and add "
            "?password_file=PATH, or in an environment variable and add ?password_env=NAME"
        )
    if "/" in dbname:
        raise DatabaseURLError(f"the database URL's path is one database name: {redact(value)}")
    user = unquote(userinfo) if at else ""
    dbname = unquote(dbname)
    params = _query(query, value)
    for key in SECRET_PARAMETERS:
        if key in params:
            raise DatabaseURLError(
                f"the database URL holds a secret in ?{key}=: put a password in a file and add "
                "?password_file=PATH, or in an environment variable and add ?password_env=NAME"
            )
    password_file = params.pop("password_file", None)
    password_env = params.pop("password_env", None)
    if password_file is not None and password_env is not None:
        raise DatabaseURLError("the database URL gives both password_file= and password_env=: keep one")
    password: str | None = None
    password_from = ""
    if password_file is not None:
        if not password_file:
            raise DatabaseURLError("the database URL's password_file= is empty: name the file with the password")
        file = Path(password_file).expanduser()
        password_from = f"file {file}"
        if read_password:
            password = _read_password_file(file)
    elif password_env is not None:
        if not password_env:
            raise DatabaseURLError("the database URL's password_env= is empty: name the environment variable")
        password_from = f"environment {password_env}"
        if read_password:
            password = environ.get(password_env)
            if password is None:
                raise DatabaseURLError(
                    f"the database password's environment variable {password_env} (password_env=) is not set"
                )
            if not password:
                raise DatabaseURLError(
                    f"the database password's environment variable {password_env} (password_env=) is empty"
                )
    _check_hosts(hosts, value)
    passed = f"?{urlencode(params, quote_via=quote)}" if params else ""
    path = f"/{quote(dbname, safe='')}" if dbname or slash else ""
    q_user = quote(user, safe="")
    credentials = f"{q_user}:{quote(password, safe='')}@" if password is not None else (f"{q_user}@" if user else "")
    dsn = f"postgresql://{credentials}{hosts}{path}{passed}"
    shown_hosts = hosts
    if hosts and "PGPORT" not in environ:
        shown_hosts = ",".join(h if _port_of(h) else f"{h}:{DEFAULT_PORT}" for h in hosts.split(","))
    shown = f"postgresql://{q_user + '@' if user else ''}{shown_hosts}{path}{passed}"
    return DatabaseLocation(engine="postgresql", path=None, dsn=dsn, shown=redact(shown), password_from=password_from)


def _query(query: str, value: str) -> dict[str, str]:
    params: dict[str, str] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise DatabaseURLError(f"the database URL's parameters are not KEY=VALUE&…: {redact(value)}") from None
    for key, val in pairs:
        if key in params:
            raise DatabaseURLError(f"the database URL gives {key}= twice")
        params[key] = val
    return params


def _port_of(host: str) -> str:
    """The port of one HOST[:PORT] of a URL ("" for none); IPv6 addresses stand in brackets."""
    if host.startswith("["):
        _, _, after = host.partition("]")
        return after[1:] if after.startswith(":") else ""
    return host.rpartition(":")[2] if ":" in host else ""


def _check_hosts(hosts: str, value: str) -> None:
    if not hosts:
        return  # libpq's default: the local socket (or PGHOST)
    for host in hosts.split(","):
        if host.endswith(":"):
            raise DatabaseURLError(f"the database URL's host {host} has an empty port: {redact(value)}")
        if host.startswith("[") and "]" not in host:
            raise DatabaseURLError(f"the database URL's host {host} lacks its closing ]: {redact(value)}")
        port = _port_of(host)
        name = host[: len(host) - len(port) - 1] if port else host
        if not name and port:
            raise DatabaseURLError(f"the database URL names a port but no host: {redact(value)}")
        if port and not (port.isdigit() and 0 < int(port) <= 65535):
            raise DatabaseURLError(f"the database URL's port {port!r} is not a number from 1 to 65535")


def _read_password_file(file: Path) -> str:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as e:
        raise DatabaseURLError(
            f"cannot read the database password file {file} (password_file=): {e.strerror or e}"
        ) from None
    except UnicodeDecodeError:
        raise DatabaseURLError(f"the database password file {file} (password_file=) is not UTF-8 text") from None
    password = text.rstrip("\r\n")
    if not password:
        raise DatabaseURLError(f"the database password file {file} (password_file=) is empty")
    return password
