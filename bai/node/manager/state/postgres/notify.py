"""What one manager tells the others of the same database, over PostgreSQL's LISTEN/NOTIFY: a thread of its
own holding a connection that LISTENs (made again when the server went away), and sends batched into one
statement through the database's thread (a NOTIFY is delivered once its transaction commits).

Payloads are short JSON texts (PostgreSQL takes up to 8000 bytes each); what they mean is the manager's
(services/cluster_events.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

CHANNEL = "bai_events"
MAX_PAYLOAD = 7900
FLUSH_EVERY = 0.05  # seconds notifications wait to go together (each sending commits on its own: a disk flush)

log = logging.getLogger("bai.manager")


class Notifier:
    """Sends and receives the managers' notifications (see the module's doc)."""

    def __init__(self, db: Any, dsn: str, shown: str) -> None:
        self.db = db
        self.dsn = dsn
        self.shown = shown
        self._outbox: list[str] = []
        self._flushing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, received: Callable[[list[str]], None]) -> None:
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._listen, args=(loop, received), name="postgresql listen", daemon=True
        )
        self._thread.start()

    def _listen(self, loop: asyncio.AbstractEventLoop, received: Callable[[list[str]], None]) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._stop.is_set():
                        batch = [n.payload for n in conn.notifies(timeout=0.5)]
                        if batch:
                            try:
                                loop.call_soon_threadsafe(received, batch)
                            except RuntimeError:  # the loop is closed
                                return
            except psycopg.Error as e:
                if self._stop.is_set():
                    return
                log.warning("listening for other managers on %s: %s (again in 1 s)", self.shown, str(e).strip())
                self._stop.wait(1.0)

    def send(self, payload: str) -> None:
        """Queue a notification; queued ones go in one statement, soon (in the database's thread)."""
        if len(payload) > MAX_PAYLOAD:
            return
        self._outbox.append(payload)
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_later(FLUSH_EVERY, self._flush)

    def _flush(self) -> None:
        self._flushing = False
        batch, self._outbox = list(dict.fromkeys(self._outbox)), []
        if not batch:
            return

        # (a JSON array, not text[]: psycopg escapes each element of an array by a regular expression, ~20 ms a batch)
        texts = json.dumps(batch)

        def fn(conn: Any) -> None:
            conn.execute("SELECT pg_notify(?, x) FROM json_array_elements_text(?::json) AS x", (CHANNEL, texts))

        future = self.db.run(fn)
        future.add_done_callback(_quiet)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3)


def _quiet(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("telling the other managers: %s", future.exception())
