"""Hook plugins called at session lifecycle points.

A hook is any object (usually a module) with some of these functions, sync or async:

    before_enqueue(session)     -> None, or a string: the reason to reject the session
                                   (raising HookRejected("reason") does the same)
    after_enqueue(session)
    after_start(session)
    after_termination(session)

`session` is a plain dict of the hook's own (id, name, access_key, image, type, status, requested_slots, …).
Hooks come from the `bai.hooks` entry-point group and from `[manager] hooks = ["module", …]`.
Each call has a time limit; a hook that fails or hangs is logged and noted in the session's
status_data["hooks"], and never stalls the dispatcher: only before_enqueue is waited for (in the
request that creates the session), the others run in the background.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import msgspec

from bai.node.manager.state.records import NewSession, Session, stamp

log = logging.getLogger("bai.hooks")
POINTS = ("before_enqueue", "after_enqueue", "after_start", "after_termination")


def hook_view(session: Session | NewSession) -> dict[str, Any]:
    """What a hook is given of a session: a plain dict of its own (a hook may change it: nothing of the
    manager's changes with it). A session being created is PENDING, stamped with its creation time."""
    view = msgspec.to_builtins(session)  # (a deep copy: its config and slots too)
    if isinstance(session, NewSession):
        view.update(created_at=stamp(session.created_at), status="PENDING")
    assert isinstance(view, dict)
    return view


class HookRejected(Exception):
    """Raised by a before_enqueue hook to refuse a session; the message is shown to the user."""


class Hooks:
    """The configured hook modules, called at lifecycle points with a timeout each."""

    def __init__(self, hooks: list[tuple[str, Any]], timeout: float = 2.0) -> None:
        self.hooks = hooks
        self.timeout = timeout

    @classmethod
    def load(cls, modules: list[str], timeout: float = 2.0) -> Hooks:
        found: list[tuple[str, Any]] = []
        for ep in entry_points(group="bai.hooks"):
            try:
                found.append((ep.name, ep.load()))
            except Exception:
                log.exception("cannot load hook %s", ep.name)
        for name in modules:
            found.append((name, importlib.import_module(name)))  # a configured hook must load
        return cls(found, timeout)

    def _calls(self, point: str) -> list[tuple[str, Callable[..., Any]]]:
        return [(name, fn) for name, hook in self.hooks if callable(fn := getattr(hook, point, None))]

    async def _call(self, name: str, fn: Callable[..., Any], session: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await asyncio.wait_for(fn(session), self.timeout)
        return await asyncio.wait_for(asyncio.to_thread(fn, session), self.timeout)

    async def before_enqueue(self, session: dict[str, Any]) -> tuple[str | None, list[str]]:
        """Return (rejection reason or None, notes about hooks that failed or timed out)."""
        notes: list[str] = []
        for name, fn in self._calls("before_enqueue"):
            try:
                verdict = await self._call(name, fn, session)
            except HookRejected as e:
                return f"{e} (hook {name})", notes
            except TimeoutError:
                notes.append(f"hook {name} before_enqueue timed out after {self.timeout:g} s")
                log.warning(notes[-1])
            except Exception as e:
                notes.append(f"hook {name} before_enqueue failed: {type(e).__name__}: {e}")
                log.exception("hook %s before_enqueue failed", name)
            else:
                if isinstance(verdict, str) and verdict:
                    return f"{verdict} (hook {name})", notes
        return None, notes

    async def notify(self, point: str, session: Session) -> list[str]:
        """Call every hook for `point`; return notes about the ones that failed or timed out."""
        notes: list[str] = []
        for name, fn in self._calls(point):
            try:
                await self._call(name, fn, hook_view(session))
            except TimeoutError:
                notes.append(f"hook {name} {point} timed out after {self.timeout:g} s")
                log.warning(notes[-1])
            except Exception as e:
                notes.append(f"hook {name} {point} failed: {type(e).__name__}: {e}")
                log.exception("hook %s %s failed", name, point)
        return notes

    def __bool__(self) -> bool:
        return bool(self.hooks)
