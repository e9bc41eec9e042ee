"""How bai logs: human-readable lines by default, one JSON object per line for machines."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

FORMATS = ("human", "json")


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
