"""`read_json`, the API's reading of a JSON body: lone surrogates (no UTF-8 can hold them) are refused
whether they come as a JSON escape or in the text itself, and nothing else is."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bai.common.problems import Problem
from bai.node.manager.http.context import problem_response, read_json


async def echo(request: web.Request) -> web.Response:
    try:
        return web.json_response({"body": await read_json(request)})
    except Problem as p:
        return problem_response(p)


async def post(raw: bytes, ctype: str = "application/json") -> tuple[int, Any]:
    app = web.Application()
    app.router.add_post("/", echo)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/", data=raw, headers={"Content-Type": ctype})
        return resp.status, await resp.json(content_type=None)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"name": "\\ud800"}',  # an escaped lone surrogate
        b'{"a": ["ok", {"\\uDFFF": 1}]}',  # as a key, upper case
        b'["\\udbff x"]',
    ],
)
async def test_lone_surrogates_are_refused(raw: bytes) -> None:
    status, body = await post(raw)
    assert status == 400 and "lone surrogate" in body["msg"], body


@pytest.mark.parametrize(
    "value",
    [
        {"name": "plain"},
        {"name": "caf\u00e9 \U0001f642"},  # non-ASCII, and a pair that makes one character
        {"code": "print('\\\\ud800')"},  # a backslash before "ud800": text, not an escape
        ["\\ud800"],
    ],
)
async def test_everything_else_is_read_as_sent(value: Any) -> None:
    for raw in (json.dumps(value).encode(), json.dumps(value, ensure_ascii=False).encode()):
        status, body = await post(raw)
        assert status == 200 and body["body"] == value, (raw, body)


async def test_a_body_that_is_not_json_or_not_utf8_is_a_400() -> None:
    for raw in (b"{", b'{"a": "\xff"}'):
        status, body = await post(raw)
        assert status == 400 and "not valid JSON" in body["msg"], body
