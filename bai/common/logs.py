"""How bai logs: human-readable lines by default, one JSON object per line for machines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from datetime import UTC, datetime

FORMATS = ("human", "json")
LOG_EVERY = 10.0  # seconds: a line someone else can cause at will is logged once, then counted this often


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message"[, "exception"]} on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup(fmt: str = "human", verbose: bool = False, debug: bool = False) -> None:
    """Log to stderr: warnings by default, info with verbose, everything with debug."""
    if fmt not in FORMATS:
        raise ValueError(f"--log-format wants {' or '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("bai").setLevel(logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING)
    if debug:
        root.setLevel(logging.DEBUG)


class LogThrottle:
    """A log line someone else (a kernel, a client) can cause at will: the first of a burst is logged at once,
    the ones after it are counted and said as one line (how many, in how long) at most every `every` seconds."""

    def __init__(self, logger: logging.Logger, every: float = LOG_EVERY) -> None:
        self.logger = logger
        self.every = every
        self.suppressed = 0
        self._last = -float("inf")
        self._last_message = ""
        self._flush: asyncio.TimerHandle | None = None

    def __call__(self, level: int, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last >= self.every:
            self._say_count(level)
            self._last = now
            self.logger.log(level, message, *args)
            return
        self.suppressed += 1
        self._last_message = message % args if args else message
        if self._flush is None:
            with contextlib.suppress(RuntimeError):  # no loop (a test): said with the next one
                loop = asyncio.get_running_loop()
                self._flush = loop.call_later(self._last + self.every - now, self._say_count, level)

    def _say_count(self, level: int) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self.suppressed:
            count, self.suppressed = self.suppressed, 0
            self._last = time.monotonic()
            self.logger.log(
                level, "%d more like this in the last %g s; the last: %s", count, self.every, self._last_message
            )

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
