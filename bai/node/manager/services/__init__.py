"""The manager's services in one place: built once by the node (`bai/node/main.py`), handed to the HTTP
application, and reached by handlers through `services_of(request)`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bai.common.clock import Clock
from bai.node.manager.rules.admission import Admission
from bai.node.manager.services.accounts import Accounts
from bai.node.manager.services.activity import Activity
from bai.node.manager.services.agent_registry import Agents
from bai.node.manager.services.app_forwarding import Apps
from bai.node.manager.services.fair_share import FairShare
from bai.node.manager.services.hubs import Hubs
from bai.node.manager.services.image_catalogue import Images
from bai.node.manager.services.kernel_logs import KernelLogs
from bai.node.manager.services.kernel_ops import KernelOps
from bai.node.manager.services.lifecycle import SessionLifecycle
from bai.node.manager.services.metrics import ManagerMetrics
from bai.node.manager.services.resource_presets import ResourcePresets
from bai.node.manager.services.runs import RunHistory
from bai.node.manager.services.scheduler_rounds import SchedulerRounds
from bai.node.manager.services.session_reads import SessionReads
from bai.node.manager.services.session_templates import SessionTemplates
from bai.node.manager.services.stats_book import StatsBook
from bai.node.manager.services.teams import Teams
from bai.node.manager.services.usage import Usage
from bai.node.manager.services.vfolder_service import VFolders
from bai.node.manager.state.protocols import SessionReadState


@dataclass
class Services:
    """What the API's handlers work with (never the store or the link directly)."""

    lifecycle: SessionLifecycle  # create, destroy
    kernel_ops: KernelOps  # execute, interrupt, terminals, files, restart, commit, rename
    reads: SessionReads  # which session a request names, its kernels, dependency graph, status history
    state: SessionReadState  # the state layer's session reads (handlers only read)
    activity: Activity  # terminals and app tunnels in use keep their sessions from idling
    runs: RunHistory  # each session's runs (the log view's separators)
    agents: Agents
    images: Images
    accounts: Accounts
    teams: Teams  # domains, projects, users, scaling groups and their policies
    hubs: Hubs
    logs: KernelLogs
    metrics: ManagerMetrics
    apps: Apps
    vfolders: VFolders | None = None
    templates: SessionTemplates | None = None  # session templates (Backend.AI's task templates)
    usage: Usage | None = None  # usage reports (computed when asked)
    presets: ResourcePresets | None = None  # resource presets (Backend.AI's), checked against what is free
    scheduler_rounds: SchedulerRounds | None = None  # the latest scheduling rounds, kept for replay
    fair_share: FairShare | None = None  # fair share's usage (the multifactor policy's), as the rounds count it
    admission: Admission = field(default_factory=Admission)  # the configuration's rules (registries, groups)
    stats: StatsBook = field(default_factory=StatsBook)  # live statistics (the same book the lifecycle keeps)
    clock: Clock = field(default_factory=Clock)  # the manager's one clock (a session's age as shown)
    leadership: Any = None  # (services/leadership.Leadership) the managers of the database, and which leads
