"""Keypairs and resource policies: who may use the cluster, and how much (admins change them); and the
dotfiles each keypair puts in its kernels' homes."""

from __future__ import annotations

from bai.common.clock import Clock
from bai.node.manager.state.protocols import AccountState
from bai.node.manager.state.records import Dotfile, Keypair, NewKeypair, Policy, PolicyFields
from bai.node.manager.state.team_records import email_of

__all__ = ["Accounts", "email_of"]  # (email_of: the email a user made from a keypair's user id gets)


class Accounts:
    """Keypairs, resource policies and dotfiles, as the API reads and changes them."""

    def __init__(self, state: AccountState, clock: Clock) -> None:
        self.state = state
        self.clock = clock

    def active_keypair(self, access_key: str) -> Keypair | None:
        """The active keypair of an access key (None: none or inactive), from memory: what every request's
        authentication asks (the state keeps it current on its own writes)."""
        return self.state.active_keypair(access_key)

    async def keypairs(self, active_only: bool = True) -> dict[str, Keypair]:
        """Access key -> keypair (active ones only, unless told)."""
        return await self.state.keypairs(active_only=active_only)

    async def keypair(self, access_key: str) -> Keypair | None:
        """A keypair, active or not; None: no such keypair."""
        return await self.state.keypair(access_key)

    async def create_keypair(self, keypair: NewKeypair) -> None:
        """Store a new keypair (UnknownPolicy, a KeyError, when its policy does not exist)."""
        await self.state.create_keypair(keypair, self.clock.now())

    async def update_keypair(
        self,
        access_key: str,
        *,
        resource_policy: str | None = None,
        is_active: bool | None = None,
        is_admin: bool | None = None,
    ) -> bool:
        """Change a keypair's resource_policy / is_active / is_admin; False when there is no such keypair."""
        return await self.state.update_keypair(
            access_key, resource_policy=resource_policy, is_active=is_active, is_admin=is_admin
        )

    async def delete_keypair(self, access_key: str) -> bool:
        """Remove a keypair (and its dotfiles); False when there is no such keypair."""
        return await self.state.delete_keypair(access_key)

    async def policies(self) -> dict[str, Policy]:
        return await self.state.policies()

    async def policy(self, name: str) -> Policy | None:
        return await self.state.policy(name)

    async def policy_of(self, access_key: str) -> Policy | None:
        """The resource policy a keypair follows (the default one for a keypair that does not exist)."""
        keypair = await self.state.keypair(access_key)
        policies = await self.state.policies()
        return policies.get(keypair.resource_policy if keypair else "default") or policies.get("default")

    async def save_policy(self, name: str, fields: PolicyFields, *, create: bool) -> bool:
        """Create (or update) a policy; False when it exists (or does not)."""
        return await self.state.save_policy(name, fields, create=create, now=self.clock.now())

    async def delete_policy(self, name: str) -> str | None:
        """Remove a resource policy no keypair follows; None when done, else why not."""
        if name == "default":
            return "the default resource policy stays"
        return await self.state.delete_policy(name)

    async def dotfiles(self, access_key: str) -> list[Dotfile]:
        return await self.state.dotfiles(access_key)

    async def put_dotfile(self, access_key: str, path: str, data: str, permission: str) -> None:
        await self.state.put_dotfile(access_key, path, data, permission)

    async def delete_dotfile(self, access_key: str, path: str) -> bool:
        """False when the keypair has no such dotfile."""
        return await self.state.delete_dotfile(access_key, path)
