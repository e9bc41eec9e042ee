"""A keypair cannot flood the queue: its policy's `max_pending_session_count` bounds its PENDING sessions.

Each session that cannot be placed yet waits PENDING: a row in the store and an entry in every scheduling
round's snapshot. Without a bound one ordinary keypair could grow both without limit. At creation, before
the session row is stored, `check_pending_limit` refuses the next one with a 412 (quota-exceeded) naming
the limit, while the keypair already has that many waiting; nothing is stored. A session that starts (or is
cancelled, or ends) frees its place. 0 means unlimited (what a bench submitting thousands sets).

Backend.AI's keypair resource policies have the same field (`max_pending_session_count`; GraphQL shows null
for unlimited). The count is one read in the store's thread (the policy by key, then at most `limit` entries
of the sessions_owner_status index), so a refused flood costs no more than the read.

Two creations racing past the check at the same moment may both be stored (the check and the insert are two
transactions): the queue can overshoot by the number of creations in flight, which the HTTP limits bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bai.common.problems import Problem

SLUG = "quota-exceeded"
TITLE = "Too many sessions waiting."


class PendingQueueStore(Protocol):
    async def pending_queue(self, access_key: str) -> tuple[str, int, int]: ...


@dataclass(frozen=True, slots=True)
class PendingQueue:
    """A keypair's queue as its policy bounds it."""

    access_key: str
    policy: str
    limit: int  # max_pending_session_count; 0 = unlimited
    pending: int  # its PENDING sessions (counted up to `limit`)

    @property
    def full(self) -> bool:
        return self.limit > 0 and self.pending >= self.limit

    def refusal(self) -> Problem:
        return Problem(
            SLUG,
            TITLE,
            f"keypair {self.access_key} already has {self.pending} sessions waiting (PENDING); the policy "
            f"{self.policy} allows {self.limit} (max_pending_session_count): wait for some to start or cancel them",
            data={"policy": self.policy, "max_pending_session_count": self.limit, "pending": self.pending},
        )


async def pending_queue(store: PendingQueueStore, access_key: str) -> PendingQueue:
    policy, limit, pending = await store.pending_queue(access_key)
    return PendingQueue(access_key, policy, limit, pending)


async def check_pending_limit(store: PendingQueueStore, access_key: str) -> None:
    """Raise the 412 when `access_key` may not queue one more session now (see the module docstring)."""
    queue = await pending_queue(store, access_key)
    if queue.full:
        raise queue.refusal()
