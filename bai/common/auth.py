"""Backend.AI keypair request signing (HMAC-SHA256), both sides.

The algorithm is the one of the reference spec §1.3; it is pure and unit-tested against the
published test vectors.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

EMPTY_BODY_HASH = hashlib.sha256(b"").hexdigest()
MAX_CLOCK_SKEW = timedelta(minutes=15)
SIGN_METHODS = {"HMAC-SHA256": "sha256"}  # signMethod -> hashlib name
_DECOY_SECRET = secrets.token_urlsafe(30)
_AUTH_RE = re.compile(r"^(?:BackendAI|Sorna)\s+(?P<params>.+)$")


class AuthError(Exception):
    """Authentication failed; `slug` is the problem type (auth-failed / invalid-auth-params)."""

    def __init__(self, slug: str, msg: str) -> None:
        super().__init__(msg)
        self.slug = slug
        self.msg = msg


@dataclass(frozen=True)
class Keypair:
    """An access key and its secret key (Backend.AI's API credentials)."""

    access_key: str
    secret_key: str

    @classmethod
    def generate(cls) -> Keypair:
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
        access = "AKIA" + "".join(secrets.choice(alphabet) for _ in range(16))
        return cls(access, secrets.token_urlsafe(30))


def string_to_sign(method: str, path: str, date: str, host: str, ctype: str, version: str) -> str:
    return "\n".join(
        [
            method.upper(),
            path,
            date,
            f"host:{host}",
            f"content-type:{ctype}",
            f"x-backendai-version:{version}",
            EMPTY_BODY_HASH,
        ]
    )


def parse_date(value: str) -> datetime:
    """Parse the Date header leniently: ISO-8601 or RFC 1123; naive dates are UTC."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            parsed = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            raise AuthError("invalid-auth-params", f"Cannot parse the date {value!r}.") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def sign(
    secret_key: str,
    method: str,
    path: str,
    date: str,
    host: str,
    ctype: str,
    version: str,
    hash_name: str = "sha256",
) -> str:
    """Return the hex signature of a request."""
    return _signature(secret_key, method, path, date, parse_date(date), host, ctype, version, hash_name)


@functools.lru_cache(maxsize=1024)
def signing_key(secret_key: str, day: str, host: str, hash_name: str = "sha256") -> bytes:
    """The key a request of `day` (YYYYMMDD) to `host` is signed with: derived from the secret key by two
    HMACs, the same for every request of that keypair, day and host (so kept, for the busiest ones)."""
    digest = getattr(hashlib, hash_name)
    k1 = hmac.new(secret_key.encode(), day.encode(), digest).digest()
    return hmac.new(k1, host.encode(), digest).digest()


def _signature(
    secret_key: str,
    method: str,
    path: str,
    date: str,
    when: datetime,
    host: str,
    ctype: str,
    version: str,
    hash_name: str,
) -> str:
    key = signing_key(secret_key, when.strftime("%Y%m%d"), host, hash_name)
    msg = string_to_sign(method, path, date, host, ctype, version)
    return hmac.new(key, msg.encode(), getattr(hashlib, hash_name)).hexdigest()


def now_header() -> str:
    return datetime.now(UTC).isoformat()


def authorization_header(access_key: str, signature: str) -> str:
    return f"BackendAI signMethod=HMAC-SHA256, credential={access_key}:{signature}"


def parse_authorization(value: str) -> tuple[str, str, str]:
    """Split an Authorization header into (hash name, access key, signature)."""
    m = _AUTH_RE.match(value.strip())
    if not m:
        raise AuthError("invalid-auth-params", "Malformed Authorization header.")
    params = {}
    for part in m["params"].split(","):
        key, sep, val = part.strip().partition("=")
        if sep:
            params[key.strip()] = val.strip()
    method = params.get("signMethod", "")
    cred = params.get("credential", "")
    access_key, sep, signature = cred.partition(":")
    if not method.upper().startswith("HMAC-") or not sep or not access_key or not signature:
        raise AuthError("invalid-auth-params", "Malformed Authorization header.")
    if method.upper() not in SIGN_METHODS:
        # MD5 and SHA-1 are refused (the official client signs with SHA-256); said before any
        # look-up, so the answer is the same whether or not the access key exists
        raise AuthError("invalid-auth-params", f"Unsupported signing method {method}: use HMAC-SHA256.")
    return SIGN_METHODS[method.upper()], access_key, signature


def verify(
    *,
    authorization: str | None,
    date: str | None,
    method: str,
    path: str,
    host: str,
    ctype: str,
    version: str,
    lookup_secret: Callable[[str], str | None],
    now: datetime | None = None,
) -> str:
    """Check a request signature; return the access key or raise AuthError.

    `lookup_secret(access_key)` returns the secret key, or None for an unknown/inactive key.
    """
    if not authorization:
        raise AuthError("auth-failed", "Unauthorized access.")
    hash_name, access_key, signature = parse_authorization(authorization)
    if not date:
        raise AuthError("invalid-auth-params", "Missing Date header.")
    when = parse_date(date)
    now = now or datetime.now(UTC)
    if abs(now - when) > MAX_CLOCK_SKEW:
        raise AuthError("invalid-auth-params", "Date/time sync error: the request date is too far off.")
    secret = lookup_secret(access_key)
    # an unknown key is checked against a throw-away secret: the same work and the same answer as a
    # wrong signature, so a caller cannot tell which access keys exist
    expected = _signature(
        secret if secret is not None else _DECOY_SECRET, method, path, date, when, host, ctype, version, hash_name
    )
    if not hmac.compare_digest(expected, signature) or secret is None:
        raise AuthError("auth-failed", "Signature mismatch, or the access key is unknown or inactive.")
    return access_key
