"""Kernel images: which the agents have, the aliases in effect, pulls from the configured registries
(admission decides which), and whether a session's image can run anywhere."""

from __future__ import annotations

import builtins
import contextlib
from typing import Any

from bai.common import images as imagelib
from bai.common.problems import Problem, invalid
from bai.node.link.base import AgentUnavailable, RemoteError
from bai.node.link.messages import PullGrant, RegistryAuth
from bai.node.manager.rules.admission import Admission, check_image
from bai.node.manager.services.agent_registry import Agents
from bai.node.manager.state.protocols import ImageState


class Images:
    """The image catalogue of the cluster: agents' images, aliases, pulls and removals."""

    def __init__(self, store: ImageState, agents: Agents, admission: Admission, config_aliases: dict[str, str]) -> None:
        self.store = store
        self.agents = agents
        self.admission = admission
        self.config_aliases = dict(config_aliases)  # [images.aliases]
        self.aliases: dict[str, str] = dict(config_aliases)  # in effect: the configuration's and the stored

    async def load(self) -> None:
        """Add the aliases set with `bai image alias` (kept in the database)."""
        self.aliases.update({a.alias: a.image for a in await self.store.image_aliases()})

    def is_known(self, image: str) -> bool:
        """Whether some agent has told it has `image`."""
        return self.agents.labels_of(image) is not None

    async def list(self) -> list[dict[str, Any]]:
        """Every image of every connected agent (asked now), with its agent and aliases."""
        items = []
        for agent_id in sorted(self.agents.connected()):
            for image in await self.agents.images_of(agent_id):
                self.agents.learn_labels(image.name, image.labels or {})
                aliases = sorted(a for a, t in self.aliases.items() if t == image.name)
                items.append({**image.to_api(), "agent": agent_id, "aliases": aliases})
        return items

    def pull_grant(self, image: str) -> PullGrant | None:
        """What an agent needs to pull `image` (the registry, and credentials for this pull only), None for a
        local image; a Problem when its registry is not configured."""
        if imagelib.registry_of(image) is None:
            return None
        if problem := check_image(self.admission, image):
            raise problem
        reg = self.admission.registry_for(image)
        assert reg is not None
        auth = reg.auth()
        return PullGrant(reg.host, RegistryAuth(**auth) if auth is not None else None)

    def available_unasked(self, image: str) -> bool:
        """Whether `check_available` passes `image` without asking the agents: not every agent needs it present,
        some agent has told it has it, or a registry it comes from is named."""
        return (
            self.is_known(image)  # (the cheap questions first: the last one reads every connected agent)
            or imagelib.registry_of(image) is not None
            or not self.agents.only_docker_connected()
        )

    async def check_available(self, image: str) -> None:
        """Refuse an image no agent has, when every agent needs it present (docker; local and sim
        agents take any Python image name; an image from a registry is pulled when a kernel needs it).
        An image unknown so far is looked for on the agents once more (built since they registered)."""
        if self.available_unasked(image):
            return
        with contextlib.suppress(AgentUnavailable, RemoteError, TimeoutError):
            await self.list()
        if self.is_known(image):
            return
        known = ", ".join(self.agents.known_images()) or "none"
        raise Problem(
            "invalid-api-params",
            "Unknown image.",
            f"no agent has the image {image!r} (images: {known}; add an alias under [images.aliases])",
        )

    def _targets(self, agent: Any) -> builtins.list[str]:
        if agent:
            if agent not in self.agents.connected():
                raise invalid(f"no connected agent {agent!r}")
            return [agent]
        return self.agents.docker_agents()

    async def pull(self, image: str, agent: Any = None) -> builtins.list[dict[str, Any]]:
        """Pull on one agent or every Docker agent: only from a configured registry (a name without one
        is Docker Hub's), checked before anything connects anywhere."""
        source = image if imagelib.registry_of(image) else f"docker.io/{image}"
        grant = self.pull_grant(source)
        targets = self._targets(agent)
        if not targets:
            raise invalid("no Docker agent is connected to pull it")
        done = []
        for agent_id in targets:
            try:
                result = await self.agents.pull_image(agent_id, source, grant.auth if grant else None)
            except (RemoteError, AgentUnavailable) as e:
                raise Problem("generic-bad-request", "Pull failed.", f"agent {agent_id}: {e}") from None
            self.agents.learn_labels(image, result.labels or {})
            done.append({"agent": agent_id, **result.to_api()})
        return done

    async def remove(self, image: str, agent: str | None = None) -> builtins.list[str]:
        """Remove from one agent, or from every agent that has it; the agents it was removed from."""
        have = [i["agent"] for i in await self.list() if i["name"] == image]
        targets = [agent] if agent else have
        if not targets or (agent and agent not in have):
            raise Problem("object-not-found", "No such image.", f"no agent has the image {image!r}")
        for agent_id in targets:
            try:
                await self.agents.remove_image(agent_id, image)
            except (RemoteError, AgentUnavailable) as e:
                raise Problem("generic-bad-request", "Remove failed.", f"agent {agent_id}: {e}") from None
        if not [i for i in await self.list() if i["name"] == image]:
            self.agents.forget_image(image)
        return targets

    async def set_alias(self, alias: str, image: str) -> None:
        await self.store.set_image_alias(alias, image)
        self.aliases[alias] = image

    async def remove_alias(self, alias: str) -> bool:
        """Remove an alias set with `bai image alias` (the configuration's own comes back); False if none."""
        if not await self.store.set_image_alias(alias, None):
            return False
        self.aliases.pop(alias, None)
        if alias in self.config_aliases:
            self.aliases[alias] = self.config_aliases[alias]
        return True
