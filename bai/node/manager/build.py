"""The manager's services wired together from a configuration: the one place that knows how they fit
(`bai node` and the in-process test harness both build the manager here)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from bai.common.background import Background
from bai.common.clock import Clock
from bai.common.config import duration_seconds
from bai.node.link.base import ManagerLink
from bai.node.manager.rules.admission import from_config as admission_from_config
from bai.node.manager.services import Services
from bai.node.manager.services.accounts import Accounts
from bai.node.manager.services.activity import Activity
from bai.node.manager.services.agent_events import AgentEvents
from bai.node.manager.services.agent_registry import Agents
from bai.node.manager.services.app_forwarding import Apps
from bai.node.manager.services.dispatcher import Dispatcher, preemption_graces, scaling_groups
from bai.node.manager.services.fair_share import FairShare
from bai.node.manager.services.hooks import Hooks
from bai.node.manager.services.hubs import Hubs
from bai.node.manager.services.image_catalogue import Images
from bai.node.manager.services.kernel_logs import KernelLogs
from bai.node.manager.services.kernel_ops import KernelOps
from bai.node.manager.services.lifecycle import SessionLifecycle
from bai.node.manager.services.metrics import ManagerMetrics
from bai.node.manager.services.peers import PeerRelay
from bai.node.manager.services.preemptions import Preemptions
from bai.node.manager.services.resource_presets import ResourcePresets
from bai.node.manager.services.runs import RunHistory
from bai.node.manager.services.scheduler_rounds import SchedulerRounds
from bai.node.manager.services.session_reads import SessionReads
from bai.node.manager.services.session_templates import SessionTemplates
from bai.node.manager.services.stats_book import StatsBook, stat_history_of, stat_interval_of
from bai.node.manager.services.teams import Teams
from bai.node.manager.services.timers import Timers
from bai.node.manager.services.usage import Usage
from bai.node.manager.services.vfolder_service import VFolders
from bai.node.manager.services.wakeup import Wakeup
from bai.node.manager.state import Store


@dataclass
class Manager:
    """A manager's parts, built and wired, not started: the link's handler (`agent_events`), the
    services the API serves (`services`), and the loops (`dispatcher`, `timers`) with their background."""

    store: Store
    services: Services
    agent_events: AgentEvents
    dispatcher: Dispatcher
    timers: Timers
    wake: Wakeup
    background: Background

    async def close(self) -> None:
        """Stop the loops and the background work (the store and the link are the caller's)."""
        await self.timers.stop()
        await self.dispatcher.stop()
        await self.background.close()


async def build_manager(
    cfg: dict[str, Any],
    store: Store,
    link: ManagerLink,
    vfolders: VFolders | None,
    hooks: Hooks,
    *,
    clock: Clock | None = None,
    log_retention: float | None = None,
) -> Manager:
    """Wire the services for `cfg` (ValueError for a bad scaling group, network or registry)."""
    groups, pending_timeouts = scaling_groups(cfg)
    stats = StatsBook(stat_history_of(cfg), stat_interval_of(cfg))  # kernels' and agents' live statistics
    admission = admission_from_config(cfg)  # allowed networks and image registries
    clock = clock or Clock()
    hubs, wake, metrics = Hubs(), Wakeup(), ManagerMetrics()
    background = Background(logging.getLogger("bai.manager"))
    agents = Agents(store, link, hubs.changes, wake, clock)
    if vfolders is not None:
        vfolders.use_clock(clock)  # (made before the manager, by its caller)
    images = Images(store, agents, admission, dict(cfg["images"]["aliases"]))
    await images.load()
    start_timeout = float(cfg["manager"]["preparing_timeout"])
    activity = Activity(clock)  # what the idle timeout needs: last activity, sessions with code running
    runs = RunHistory(hubs.logs.notify)  # each session's runs (the log view's separators)
    reads = SessionReads(store, hubs.events)
    lifecycle = SessionLifecycle(
        store,
        link,
        agents,
        images,
        hubs,
        activity,
        runs,
        vfolders=vfolders,
        hooks=hooks,
        admission=admission,
        metrics=metrics,
        wake=wake,
        background=background,
        start_timeout=start_timeout,
        clock=clock,
        stats=stats,
    )
    kernel_ops = KernelOps(store, link, reads, lifecycle, activity, runs, hubs.changes, agents.learn_labels, clock)
    agent_events = AgentEvents(
        agents,
        lifecycle,
        vfolders,
        wake,
        background,
        float(cfg["manager"]["lost_grace"]),
        stats=stats,
        peers=PeerRelay(link, store, background),  # multi-node kernels' connections to each other
        clock=clock,
    )
    fair_share = FairShare(
        store,
        duration_seconds(cfg["manager"].get("fair_share_half_life", "7d")),
        float(cfg["manager"].get("fair_share_gpu_weight", 10.0)),
    )
    rounds = SchedulerRounds(store, int(cfg["manager"]["scheduler_rounds_kept"]), background=background)
    dispatcher = Dispatcher(
        store,
        lifecycle,
        agents,
        wake,
        groups,
        pending_timeouts,
        tick=float(cfg["manager"]["tick"]),
        clock=clock,
        fair_share=fair_share,
        preemptions=Preemptions(lifecycle, preemption_graces(cfg)),
        rounds=rounds,
    )
    timers = Timers(
        store, lifecycle, activity, background, start_timeout, log_retention=log_retention, clock=clock, stats=stats
    )
    teams = Teams(store, clock)
    accounts = Accounts(store, clock)
    services = Services(
        lifecycle=lifecycle,
        kernel_ops=kernel_ops,
        reads=reads,
        state=store,
        activity=activity,
        runs=runs,
        agents=agents,
        images=images,
        accounts=accounts,
        teams=teams,
        hubs=hubs,
        logs=KernelLogs(store, hubs.logs),
        metrics=metrics,
        apps=Apps(link, reads, activity),
        vfolders=vfolders,
        templates=SessionTemplates(store, teams, clock),
        usage=Usage(store, teams, stats, clock, agents.gpu_devices),
        presets=ResourcePresets(store, accounts, teams, agents, tuple(admission.groups), clock),
        scheduler_rounds=rounds,
        fair_share=fair_share,
        admission=admission,
        stats=stats,
        clock=clock,
    )
    return Manager(store, services, agent_events, dispatcher, timers, wake, background)
