"""Users' passwords, kept only as salted slow hashes (scrypt, from the standard library): never stored, shown or
logged as they are. A hash reads `scrypt$N$r$p$SALT$HASH` (base64), so that its cost can be raised later and the
old hashes still check."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

N, R, P = 2**14, 8, 1  # scrypt's cost: about 16 MiB and some tens of milliseconds per hash
MAX_PASSWORD = 1024  # characters: a bound on the work one request can ask for
MIN_PASSWORD = 8


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=N, r=R, p=P, dklen=32)
    return f"scrypt${N}${R}${P}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(password: str, stored: str | None) -> bool:
    """Whether the password is the one hashed (False for no hash, or one this bai cannot read)."""
    if not stored or len(password) > MAX_PASSWORD:
        return False
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt" or int(n) > 2**20:
            return False
        expected = base64.b64decode(digest)
        again = hashlib.scrypt(
            password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected)
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(again, expected)
