"""An agent's link to several managers at once (managers that share one database): one link per manager.

`FanoutAgentLink` is an `AgentLink` over a list of per-manager links, all serving the same handler, so that
every manager can call the agent and gets its events:

- `join` joins every manager concurrently and returns the first answer; it raises only when every manager
  failed, naming each failure. A manager that failed to join is tried again in the background, with a fresh
  link every `retry_interval` seconds, until `close`; when it takes the agent, its answer goes to
  `handler.rejoined` (as a re-registration's would), so a manager that starts later, or comes back, gets the
  agent. A manager that goes away after joining is the link's own business: it re-registers by itself.
- `emit` goes to every joined link at once; a link that fails does not stop the others (it raises only when
  every link failed). A link buffers what a manager that is down has not acknowledged.
- `report` goes to every joined link and returns as soon as one manager has handled it (they share the
  database): a manager that is down must not hold the agent up; the others deliver when they can.
- calls and streams that a manager opens come through its link's own dispatch to the shared handler.
- `close` / `abort` close / abort every link and stop the background joins.

With one manager, use the plain link: this class is for two or more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bai.node.link.base import AgentHandler, AgentLink
from bai.node.link.zmq import LinkRefused, LinkUnavailable

log = logging.getLogger(__name__)

RETRY_INTERVAL = 3.0  # seconds between a failed join and the next try with a fresh link


@dataclass
class _Manager:
    """One manager: how to make a link to it, the link it has now, and whether that link joined."""

    name: str
    make: Callable[[], AgentLink]
    link: AgentLink | None = None
    joined: bool = False
    tries: int = 0
    failure: BaseException | None = field(default=None, repr=False)


class FanoutAgentLink:
    """An agent's side of links to several managers; see the module's docstring."""

    def __init__(
        self,
        makers: Sequence[Callable[[], AgentLink]],
        names: Sequence[str] | None = None,
        retry_interval: float = RETRY_INTERVAL,
    ) -> None:
        """`makers[i]()` makes a fresh, unjoined link to manager i (a link joins once, so every try needs one);
        `names[i]` names it in logs and errors (its endpoint)."""
        if not makers:
            raise ValueError("a fanout link needs at least one manager")
        shown = list(names) if names is not None else [f"manager {i + 1}" for i in range(len(makers))]
        if len(shown) != len(makers):
            raise ValueError(f"{len(makers)} managers but {len(shown)} names")
        self.managers = [_Manager(name, make) for name, make in zip(shown, makers, strict=True)]
        self.retry_interval = retry_interval
        self.handler: AgentHandler | None = None
        self._closed = False
        self._background: set[asyncio.Task[Any]] = set()

    def joined(self) -> list[str]:
        """The names of the managers that have the agent now (joined, and not closed)."""
        return [m.name for m in self.managers if m.joined]

    # -- joining ------------------------------------------------------------------------------------

    async def join(self, handler: AgentHandler) -> dict[str, Any]:
        """Join every manager concurrently; the first answer. Those that fail keep trying in the background."""
        assert self.handler is None, "join() once per link"
        self.handler = handler
        tries: dict[asyncio.Task[dict[str, Any]], _Manager] = {}
        for m in self.managers:
            tries[asyncio.create_task(self._try(m), name=f"fanout-join-{m.name}")] = m
        pending = set(tries)
        answer: dict[str, Any] | None = None
        try:
            while pending and answer is None:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if answer is None and task.exception() is None:
                        answer = task.result()
                        tries.pop(task)
        except BaseException:  # cancelled while joining (the node is stopping)
            for task in tries:
                task.cancel()
            await asyncio.gather(*tries, return_exceptions=True)
            await self._each(lambda link: _abort(link), [m for m in self.managers if m.link is not None])
            raise
        if answer is None:
            failures = "; ".join(f"{m.name}: {m.failure}" for m in self.managers)
            if all(isinstance(m.failure, LinkRefused) for m in self.managers):
                raise LinkRefused(f"every manager refused this agent: {failures}")
            raise LinkUnavailable(f"no manager took this agent: {failures}")
        for task, m in tries.items():  # the rest: their first try goes on, then they retry until close
            self._spawn(self._follow(m, task), f"fanout-rejoin-{m.name}")
        return answer

    async def _try(self, m: _Manager) -> dict[str, Any]:
        """One join of manager `m` with a fresh link; on failure the link is dropped and `m.failure` says why."""
        assert self.handler is not None
        m.tries += 1
        link = m.make()
        m.link = link
        try:
            answer = await link.join(self.handler)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            m.failure = e
            m.link = None
            with contextlib.suppress(Exception):
                await _abort(link)
            raise
        m.joined, m.failure = True, None
        return answer

    async def _follow(self, m: _Manager, first: asyncio.Task[dict[str, Any]]) -> None:
        """After `join` returned: wait for manager `m`'s first try, then try again until it takes the agent."""
        assert self.handler is not None
        try:
            answer = await first
        except Exception:
            answer = None
        while answer is None:
            if m.tries == 1 or m.tries % 20 == 0:
                log.warning(
                    "manager %s did not take the agent (%s): trying again every %g s",
                    m.name,
                    m.failure,
                    self.retry_interval,
                )
            await asyncio.sleep(self.retry_interval)
            if self._closed:
                return
            try:
                answer = await self._try(m)
            except Exception:
                continue
        log.info("manager %s took the agent (after %d tries)", m.name, m.tries)
        try:
            await self.handler.rejoined(answer)
        except Exception:
            log.exception("reconciling with manager %s's answer failed", m.name)

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- events -------------------------------------------------------------------------------------

    def _live(self) -> list[AgentLink]:
        links = [m.link for m in self.managers if m.joined and m.link is not None]
        if self._closed or not links:
            raise LinkUnavailable("the agent link is closed" if self._closed else "no manager has joined")
        return links

    async def emit(self, name: str, payload: dict[str, Any]) -> None:
        """To every joined manager at once; raises only when every link failed (the first failure)."""
        links = self._live()
        results = await asyncio.gather(*(link.emit(name, payload) for link in links), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        for link, r in zip(links, results, strict=True):
            if isinstance(r, BaseException):
                log.debug("event %s to %s failed: %s", name, self._name_of(link), r)
        if len(failures) == len(links):
            raise failures[0]

    async def report(self, name: str, payload: dict[str, Any]) -> None:
        """To every joined manager; returns when the first one handled it, raises only when every link failed.
        The others go on in the background (each link delivers once its manager is back)."""
        links = self._live()
        tasks = [asyncio.ensure_future(link.report(name, payload)) for link in links]
        pending = set(tasks)
        failures: list[BaseException] = []
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                handled = [t for t in done if t.exception() is None]
                failures += [e for t in done if (e := t.exception()) is not None]
                if handled:  # one manager has it
                    break
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        for task in pending:
            self._spawn(_quietly(task, name), f"fanout-report-{name}")
        if not pending and len(failures) == len(tasks):
            raise failures[0]

    def _name_of(self, link: AgentLink) -> str:
        return next((m.name for m in self.managers if m.link is link), "?")

    # -- closing ------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the background joins, then close every link (each sends what it holds and says bye)."""
        await self._stop(lambda link: link.close())

    async def abort(self) -> None:
        """Stop the background joins and drop every link the way a crash would (no bye)."""
        await self._stop(_abort)

    async def _stop(self, how: Callable[[AgentLink], Awaitable[None]]) -> None:
        if self._closed:
            return
        self._closed = True
        background = list(self._background)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)  # (a join in progress drops its link)
        await self._each(how, [m for m in self.managers if m.link is not None])

    @staticmethod
    async def _each(how: Callable[[AgentLink], Awaitable[None]], managers: list[_Manager]) -> None:
        links = [m.link for m in managers if m.link is not None]
        results = await asyncio.gather(*(how(link) for link in links), return_exceptions=True)
        for m, r in zip(managers, results, strict=True):
            m.joined = False
            if isinstance(r, Exception):
                log.warning("closing the link to manager %s failed: %s", m.name, r)


async def _abort(link: AgentLink) -> None:
    """Drop a link without a bye where it can (`abort`), else close it."""
    abort: Callable[[], Awaitable[None]] | None = getattr(link, "abort", None)
    await (abort() if abort is not None else link.close())


async def _quietly(task: asyncio.Future[None], name: str) -> None:
    """Wait for a report's delivery to one more manager (cancelled with it); a failure is only logged: another
    manager has handled it."""
    try:
        await task
    except Exception as e:
        log.debug("report %s to one more manager failed: %s", name, e)
