"""Problem types of the API error body (reference spec §1.4), shared by server and client."""

from __future__ import annotations

PROBLEM_BASE = "https://api.backend.ai/probs/"

STATUS_OF = {
    "auth-failed": 401,
    "invalid-auth-params": 400,
    "invalid-api-params": 400,
    "generic-bad-request": 400,
    "object-not-found": 404,
    "url-not-found": 404,
    "session-already-exists": 400,
    "too-many-sessions-matched": 404,
    "generic-forbidden": 403,
    "insufficient-privilege": 403,
    "quota-exceeded": 412,
    "instance-not-available": 503,
    "database-unavailable": 503,  # bai's: the manager's database server cannot be reached
    "not-implemented": 501,
    "internal-server-error": 500,
    "insufficient-storage": 507,
}


class Problem(Exception):
    """An API error with a problem slug, a title and an optional message / data."""

    def __init__(
        self, slug: str, title: str, msg: str | None = None, data: object = None, status: int | None = None
    ) -> None:
        super().__init__(msg or title)
        self.slug = slug
        self.title = title
        self.msg = msg
        self.data = data
        self.status = status or STATUS_OF.get(slug, 400)

    def body(self) -> dict[str, object]:
        body: dict[str, object] = {"type": PROBLEM_BASE + self.slug, "title": self.title}
        if self.msg:
            body["msg"] = self.msg
        if self.data is not None:
            body["data"] = self.data
        return body


def invalid(msg: str, data: object = None) -> Problem:
    return Problem("invalid-api-params", "Missing or invalid API parameters.", msg, data)


def no_session(ref: str) -> Problem:
    return Problem("object-not-found", "No such session.", f"Session (id={ref}) does not exist.")
