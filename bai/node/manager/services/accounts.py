"""Keypairs and resource policies: who may use the cluster, and how much (admins change them)."""

from __future__ import annotations

from typing import Any

from bai.node.manager.state import Store


def email_of(user_id: str) -> str:
    """A user's email as Backend.AI shows one (bai's users are the user ids of its keypairs): the user id
    when it is an email, else `<user id>@bai.local`. Wherever a user is named or shown (GraphQL's users
    and keypairs, folder shares and invitations), this is the one rule."""
    return user_id if "@" in user_id else f"{user_id}@bai.local"


class Accounts:
    """Keypairs and resource policies, as the admin API reads and changes them."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def keypairs(self, active_only: bool = True) -> dict[str, dict[str, Any]]:
        """Access key -> keypair row (active ones only, unless told)."""
        return await self.store.keypairs(active_only=active_only)

    async def create_keypair(self, keypair: dict[str, Any]) -> None:
        await self.store.create_keypair(keypair)

    async def update_keypair(self, access_key: str, **cols: Any) -> bool:
        """Change a keypair's resource_policy / is_active; False when there is no such keypair."""
        return await self.store.update_keypair(access_key, **cols)

    async def delete_keypair(self, access_key: str) -> bool:
        """Remove a keypair (and its dotfiles); False when there is no such keypair."""
        return await self.store.delete_keypair(access_key)

    async def policies(self) -> dict[str, dict[str, Any]]:
        return await self.store.policies()

    async def save_policy(self, name: str, fields: dict[str, Any], *, create: bool) -> bool:
        """Create (or update) a policy; False when it exists (or does not)."""
        return await self.store.save_policy(name, fields, create=create)

    async def delete_policy(self, name: str) -> str | None:
        """Remove a resource policy no keypair follows; None when done, else why not."""
        if name == "default":
            return "the default resource policy stays"
        return await self.store.delete_policy(name)
