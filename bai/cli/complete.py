"""Shell completion of values: session names, image names and aliases, statuses and vfolder names.

Typer calls these as `autocompletion=` callbacks with the word typed so far. Each asks the manager once
(the saved credentials, a plain blocking request in a thread) and gives up after `TIMEOUT` seconds, or on
any error (no credentials, manager unreachable, refused): then there are no candidates and nothing is
printed, so completing never hangs a shell nor shows an error in it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from typing import Any

TIMEOUT = 1.5  # seconds a completion may wait for the manager


def ask(fetch: Callable[[Any], Coroutine[Any, Any, Any]], timeout: float = TIMEOUT) -> Any:
    """What `fetch(client)` returns, or None when it fails or takes longer than `timeout`."""
    box: list[Any] = []

    def work() -> None:
        try:
            from bai.cli.common import answer_blocking
            from bai.client import Client
            from bai.common import credentials

            creds = credentials.load()
            if creds is None:
                return
            c = Client(creds)
            c.blocking = True
            answered, value = answer_blocking(fetch(c))  # (one that needs an event loop: not for completion)
            if answered:
                box.append(value)
        except Exception:  # any failure: no candidates
            return

    thread = threading.Thread(target=work, daemon=True)  # a hung connection is left behind, never waited for
    thread.start()
    thread.join(timeout)
    return box[0] if box else None


def _matching(candidates: list[str], incomplete: str) -> list[str]:
    seen: dict[str, None] = {}
    for name in candidates:
        if name and name.startswith(incomplete):
            seen.setdefault(name, None)
    return list(seen)


def complete_sessions(incomplete: str) -> list[str]:
    """Names of your sessions (every status the default listing shows)."""
    items = ask(lambda c: c.list_sessions())
    return _matching([str(s.get("name") or "") for s in items or []], incomplete)


def complete_images(incomplete: str) -> list[str]:
    """Image names the agents have, and the aliases that stand for them."""
    items = ask(lambda c: c.images())
    names: list[str] = []
    for image in items or []:
        names += [str(a) for a in image.get("aliases") or []]
        names.append(str(image.get("name") or ""))
    return _matching(names, incomplete)


def complete_folders(incomplete: str) -> list[str]:
    """Names of your vfolders and those shared with you."""
    items = ask(lambda c: c.vfolders())
    return _matching([str(f.get("name") or "") for f in items or []], incomplete)


def complete_statuses(incomplete: str) -> list[str]:
    """Session statuses in lower case; after a comma, the next of a list (`running,pe` → `running,pending`)."""
    from bai.common.status import SessionStatus

    done, _, last = incomplete.rpartition(",")
    prefix = f"{done}," if done else ""
    taken = set(done.lower().split(",")) if done else set()
    names = [s.value.lower() for s in SessionStatus if s.value.lower() not in taken]
    return [prefix + n for n in names if n.startswith(last.lower())]
