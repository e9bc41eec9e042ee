"""Tests for bai/common/auth.py: Backend.AI keypair request signing and verification."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bai.common import auth
from bai.common.auth import AuthError, Keypair

ACCESS = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HOST = "127.0.0.1:8081"
DATE = "2024-05-01T12:34:56.789012+00:00"
VERSION = "v7.20230615"
WHEN = datetime(2024, 5, 1, 12, 34, 56, 789012, tzinfo=UTC)


@pytest.mark.parametrize(
    ("method", "path", "ctype", "expected"),
    [
        ("POST", "/session", "application/json", "a6c01bec63074e2d073f9c2aacb4ddf44a57a816ab5ca2a0079de685c22fed4f"),
        (
            "GET",
            "/stream/session/3f2b1c9e-0000-4000-8000-000000000001/execute",
            "application/octet-stream",
            "921a5a86838de261c9f89127f87148e90d8bdb2ec6e2ffbc47bc5ecb0ad5c03e",
        ),
        (
            "DELETE",
            "/session/mysess01?forced=true",
            "text/plain",
            "2acadb3a278b41f09c67b4d057ef37d27629b3cb1b74904db9cd5cbee8b7dbf9",
        ),
    ],
)
def test_sign_matches_spec_vectors(method: str, path: str, ctype: str, expected: str) -> None:
    assert auth.sign(SECRET, method, path, DATE, HOST, ctype, VERSION) == expected


def lookup(access_key: str) -> str | None:
    return {ACCESS: SECRET}.get(access_key)


def signed_header(secret: str = SECRET, access: str = ACCESS, *, prefix: str = "BackendAI", date: str = DATE) -> str:
    sig = auth.sign(secret, "POST", "/session", date, HOST, "application/json", VERSION)
    return f"{prefix} signMethod=HMAC-SHA256, credential={access}:{sig}"


def do_verify(authorization: str | None, date: str | None = DATE, now: datetime = WHEN) -> str:
    return auth.verify(
        authorization=authorization,
        date=date,
        method="POST",
        path="/session",
        host=HOST,
        ctype="application/json",
        version=VERSION,
        lookup_secret=lookup,
        now=now,
    )


def test_verify_accepts_correct_signature() -> None:
    assert do_verify(signed_header()) == ACCESS


def test_verify_accepts_header_built_by_authorization_header() -> None:
    sig = auth.sign(SECRET, "POST", "/session", DATE, HOST, "application/json", VERSION)
    assert do_verify(auth.authorization_header(ACCESS, sig)) == ACCESS


def test_verify_accepts_legacy_sorna_prefix() -> None:
    assert do_verify(signed_header(prefix="Sorna")) == ACCESS


@pytest.mark.parametrize("authorization", [None, ""])
def test_verify_rejects_missing_authorization(authorization: str | None) -> None:
    with pytest.raises(AuthError) as exc:
        do_verify(authorization)
    assert exc.value.slug == "auth-failed"


def test_verify_rejects_wrong_secret() -> None:
    with pytest.raises(AuthError) as exc:
        do_verify(signed_header(secret="not-the-secret"))
    assert exc.value.slug == "auth-failed"
    assert "Signature mismatch" in exc.value.msg


def test_unknown_key_and_wrong_signature_get_the_same_answer() -> None:
    """Nothing in the answer tells which access keys exist."""
    answers = []
    for header in (signed_header(secret="not-the-secret"), signed_header(access="AKIANOBODYKNOWSTHIS0")):
        with pytest.raises(AuthError) as exc:
            do_verify(header)
        answers.append((exc.value.slug, exc.value.msg))
    assert answers[0] == answers[1]


@pytest.mark.parametrize("method", ["HMAC-MD5", "HMAC-SHA1", "hmac-sha1", "HMAC-SHA512", "HMAC-SHA224"])
@pytest.mark.parametrize("access", [ACCESS, "AKIANOBODYKNOWSTHIS0"])
def test_weak_or_unknown_sign_methods_are_refused_for_any_key(method: str, access: str) -> None:
    """Signed correctly with MD5 / SHA-1 (once accepted), or another hash: refused before the key is
    looked up, with one answer whether or not the key exists."""
    hash_name = method[5:].lower().replace("-", "")
    sig = auth.sign(SECRET, "POST", "/session", DATE, HOST, "application/json", VERSION, hash_name)
    with pytest.raises(AuthError) as exc:
        do_verify(f"BackendAI signMethod={method}, credential={access}:{sig}")
    assert exc.value.slug == "invalid-auth-params"
    assert "HMAC-SHA256" in exc.value.msg


def test_verify_rejects_signature_for_another_path() -> None:
    sig = auth.sign(SECRET, "POST", "/session/other", DATE, HOST, "application/json", VERSION)
    with pytest.raises(AuthError, match="Signature mismatch"):
        do_verify(f"BackendAI signMethod=HMAC-SHA256, credential={ACCESS}:{sig}")


def test_verify_rejects_unknown_access_key() -> None:
    with pytest.raises(AuthError) as exc:
        do_verify(signed_header(access="AKIANOBODYKNOWSTHIS0"))
    assert exc.value.slug == "auth-failed"


@pytest.mark.parametrize("offset", [timedelta(minutes=16), timedelta(minutes=-16)])
def test_verify_rejects_date_16_minutes_off(offset: timedelta) -> None:
    with pytest.raises(AuthError) as exc:
        do_verify(signed_header(), now=WHEN + offset)
    assert exc.value.slug == "invalid-auth-params"


@pytest.mark.parametrize("offset", [timedelta(minutes=14), timedelta(minutes=-14)])
def test_verify_accepts_date_14_minutes_off(offset: timedelta) -> None:
    assert do_verify(signed_header(), now=WHEN + offset) == ACCESS


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer abc",
        "BackendAI",
        "BackendAI signMethod=HMAC-SHA256",
        f"BackendAI signMethod=HMAC-SHA256, credential={ACCESS}",
        f"BackendAI signMethod=RSA, credential={ACCESS}:abcd",
        f"BackendAI signMethod=HMAC-NOPE512, credential={ACCESS}:abcd",
    ],
)
def test_verify_rejects_malformed_authorization(authorization: str) -> None:
    with pytest.raises(AuthError) as exc:
        do_verify(authorization)
    assert exc.value.slug == "invalid-auth-params"


def test_verify_rejects_missing_date() -> None:
    with pytest.raises(AuthError) as exc:
        do_verify(signed_header(), date=None)
    assert exc.value.slug == "invalid-auth-params"


def test_verify_rejects_unparsable_date() -> None:
    with pytest.raises(AuthError) as exc:
        do_verify(signed_header(), date="yesterday at noon")
    assert exc.value.slug == "invalid-auth-params"


def test_parse_date_rfc1123() -> None:
    assert auth.parse_date("Wed, 01 May 2024 12:34:56 GMT") == datetime(2024, 5, 1, 12, 34, 56, tzinfo=UTC)


def test_parse_date_naive_iso_is_utc() -> None:
    parsed = auth.parse_date("2024-05-01T12:34:56")
    assert parsed.utcoffset() == timedelta(0)
    assert parsed == datetime(2024, 5, 1, 12, 34, 56, tzinfo=UTC)


def test_parse_date_keeps_offset() -> None:
    assert auth.parse_date("2024-05-01T21:34:56+09:00") == datetime(2024, 5, 1, 12, 34, 56, tzinfo=UTC)


def test_parse_date_garbage_raises() -> None:
    with pytest.raises(AuthError) as exc:
        auth.parse_date("not a date")
    assert exc.value.slug == "invalid-auth-params"


def test_keypair_generate_gives_distinct_keys() -> None:
    pairs = [Keypair.generate() for _ in range(20)]
    assert len({p.access_key for p in pairs}) == 20
    assert len({p.secret_key for p in pairs}) == 20
    for p in pairs:
        assert p.access_key.startswith("AKIA") and len(p.access_key) == 20
        assert p.secret_key and p.secret_key != p.access_key
