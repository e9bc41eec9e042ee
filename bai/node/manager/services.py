"""The manager's services in one place: built once by the node (`bai/node/main.py`), handed to the HTTP
application, and reached by handlers through `services_of(request)`."""

from __future__ import annotations

from dataclasses import dataclass, field

from bai.node.manager.accounts import Accounts
from bai.node.manager.agents import Agents
from bai.node.manager.apps import Apps
from bai.node.manager.events import Hubs
from bai.node.manager.images import Images
from bai.node.manager.kernel_logs import KernelLogs
from bai.node.manager.metrics import ManagerMetrics
from bai.node.manager.sessions import Sessions
from bai.node.manager.stats import StatsBook
from bai.node.manager.vfolders.service import VFolders


@dataclass
class Services:
    """What the API's handlers work with (never the store or the link directly)."""

    sessions: Sessions
    agents: Agents
    images: Images
    accounts: Accounts
    hubs: Hubs
    logs: KernelLogs
    metrics: ManagerMetrics
    apps: Apps
    vfolders: VFolders | None = None
    stats: StatsBook = field(default_factory=StatsBook)  # live statistics (the same book Sessions keeps)
