"""Typed records from sqlite3 rows: msgspec `Struct(frozen=True)` against `@dataclass(frozen=True, slots=True)`
against today's dict, building 10,000 of them and reading their fields. Ratios are of the same run.

    .venv/bin/python bench/records.py
"""

from __future__ import annotations

import sqlite3
import timeit
from dataclasses import dataclass

import msgspec

N = 10_000
COLUMNS = ("access_key", "secret_key", "user_id", "is_admin", "is_active", "resource_policy", "created_at")


class KeypairStruct(msgspec.Struct, frozen=True):
    access_key: str
    secret_key: str
    user_id: str
    is_admin: int
    is_active: int
    resource_policy: str
    created_at: str


@dataclass(frozen=True, slots=True)
class KeypairData:
    access_key: str
    secret_key: str
    user_id: str
    is_admin: int
    is_active: int
    resource_policy: str
    created_at: str


def rows() -> list[sqlite3.Row]:
    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    conn.execute(f"CREATE TABLE k({', '.join(COLUMNS)})")
    conn.executemany(
        "INSERT INTO k VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(f"AK{i}", f"SK{i}", f"user{i}", i % 2, 1, "default", "2020-01-01T00:00:00+00:00") for i in range(N)],
    )
    return conn.execute("SELECT * FROM k").fetchall()


def best(fn: object, number: int = 5) -> float:
    return min(timeit.repeat(fn, number=1, repeat=number))  # type: ignore[arg-type]


def main() -> None:
    data = rows()
    build = {
        "dict": best(lambda: [dict(r) for r in data]),
        "msgspec": best(lambda: [KeypairStruct(*r) for r in data]),
        "dataclass": best(lambda: [KeypairData(*r) for r in data]),
    }
    dicts = [dict(r) for r in data]
    structs = [KeypairStruct(*r) for r in data]
    classes = [KeypairData(*r) for r in data]
    read = {
        "dict": best(lambda: [(d["access_key"], d["is_active"], d["resource_policy"]) for d in dicts]),
        "msgspec": best(lambda: [(s.access_key, s.is_active, s.resource_policy) for s in structs]),
        "dataclass": best(lambda: [(c.access_key, c.is_active, c.resource_policy) for c in classes]),
    }
    print(f"{N:,} records of {len(COLUMNS)} columns, best of 5 (ratios to dict, same run)")
    for what, figures in (("build", build), ("read 3 fields", read)):
        for kind, t in figures.items():
            print(f"  {what:<14} {kind:<10} {t * 1e3:7.2f} ms  x{t / figures['dict']:.2f}")


if __name__ == "__main__":
    main()
