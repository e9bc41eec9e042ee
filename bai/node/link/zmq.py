"""The ZeroMQ link between a manager and agents on other hosts.

One ROUTER on the manager (CURVE server), one DEALER per agent link object (CURVE client with a fresh key
pair, routing id `AGENT_ID.LINK_ID` where LINK_ID is random: readable, and unguessable, so no other client
of the public manager key can take an agent's routing id over). Only a `register` with the join token makes
a routing id known to the manager; anything else from an unknown routing id is answered `register-please`.
Every message is one msgpack frame `[kind, body]` (the ROUTER adds the routing-id frame):

agent → manager
  register   {agent_id, token, link, attempt, registration}
  heartbeat  {link, low, sent, payload}
  event      {link, seq, low, name, payload: msgpack bytes of the payload, ack_wanted}
  reply      {id, ok: true, result} | {id, ok: false, kind, message}
  bye        {}
manager → agent
  registered {attempt, answer}    refused {reason, attempt}    register-please {}
  call       {id, method, args}
  ack        {link, seq}          (cumulative: every event up to seq was handled)
  resend     {link, from}         (a gap: send again from this seq)
  bye-ack    {link, seq}          (the agent_left("closed") was handled, and every event up to seq)
  stream-open {sid, kind, args}   (start `handler.handle_stream(kind, args, stream)` on the agent)
both ways (streams, see streams.py)
  stream-data   {sid, frame}
  stream-credit {sid, n}          (the receiver took n more frames: the sender may send n more)
  stream-close  {sid, reason}     ("" for a normal end, "Type: message" when the agent's handler raised)

Events are numbered per agent link object (`link` is a random id of that object, so a restarted agent
starts again from 1). The agent keeps every event until an ack covers it and sends the unacked ones again
after a re-registration or when the manager asks (it compares a heartbeat's `sent` with what it got), so an
event survives a manager restart or a network cut. `low` is the lowest seq the agent still holds: the
manager never waits for anything below it. The manager delivers events to its handler in seq order, one at
a time, per agent, and drops duplicates; delivery is at least once across a manager restart (an event
handled but not yet acknowledged is sent to the next manager again).

Streams are not events: their messages are handled as they come in (not by the event pump), never acked and
never sent again. A stream's frames keep their order (one DEALER↔ROUTER connection does), and each direction
has credit-based flow control: a sender has at most `WINDOW` frames the receiver has not taken yet, so a busy
stream queues at most that much ahead of the agent's heartbeats and replies. A stream ends when either side
closes it, when the manager drops the agent (it closed its link or was lost), when the agent registers again
(a new link object, or the manager asked it to), and when either link closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import zmq
import zmq.asyncio

from bai.common.background import cancel_and_wait
from bai.node.link.base import AgentHandler, AgentUnavailable, ManagerHandler, RemoteError
from bai.node.link.keys import ManagerSecrets
from bai.node.link.streams import WINDOW, LinkStream, StreamClosed
from bai.node.link.wire import pack, unpack

log = logging.getLogger("bai.link")

HWM = 100_000  # messages queued per peer before sends wait (agent) or fail (manager)
MAX_BUFFERED_EVENTS = 100_000  # unacknowledged events an agent keeps; beyond, the oldest are dropped
MAX_BUFFERED_BYTES = 256 * 1024 * 1024  # and their encoded size
SEND_WINDOW = 2_000  # events sent and not yet acknowledged, at most (the rest waits in the agent's buffer)
REGISTER_RETRY = 1.0  # seconds between register messages while no answer comes
REFUSED_RETRY = 5.0  # seconds between re-registrations the manager refuses
RESEND_ASK_INTERVAL = 1.0  # the manager asks for a resend of the same gap at most this often
ACK_EVERY = 100  # the manager acknowledges at least every this many events of a burst
NUDGE_INTERVAL = 0.5  # register-please to one unknown peer at most this often
SEND_BATCH = 256  # events the agent sends before letting other tasks run
RECV_BATCH = 512  # messages the manager takes in one turn of the event loop before letting others run
# The largest message each side takes (ZMQ_MAXMSGSIZE): libzmq drops the connection of a peer that sends a
# larger one before buffering it (the DEALER reconnects). To the manager the largest is a download's reply:
# at most DownloadFiles.max_bytes (64 MiB) of archives, plus 1 MiB of tar headers per path (5 paths);
# to an agent an upload call (the API takes 16 MiB of files). Streams carry frames of 256 KiB.
MAX_MESSAGE_TO_MANAGER = 128 * 1024 * 1024
MAX_MESSAGE_TO_AGENT = 64 * 1024 * 1024
DROP_LOG_EVERY = 10.0  # seconds between two log lines about dropped link connections
# A connection to the manager's link that has not finished its ZMTP / CURVE handshake within this many ms is
# dropped by libzmq (a connect-and-wait client holds no file descriptor past it)
HANDSHAKE_MS = 10_000

# the manager's socket is a plain (blocking-API) socket driven by the event loop: sends never wait (NOBLOCK:
# queued at once, or refused), and one reader callback takes every message that is in. pyzmq's asyncio
# sockets make a future, a poll and several callbacks per message, which cost more than the messages.
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
_raw_send = zmq.backend.Socket.send  # the Cython send, without the Python layer's argument handling
_raw_recv = zmq.backend.Socket.recv


class LinkRefused(Exception):
    """The manager refused this agent (a wrong join token, or its registration failed)."""


class LinkUnavailable(Exception):
    """No manager answered in time, or the link is closed."""


def _pack(kind: str, body: dict[str, Any]) -> bytes:
    return pack([kind, body])


def _unpack(data: bytes) -> tuple[str, dict[str, Any]]:
    kind, body = unpack(data)
    if not isinstance(kind, str) or not isinstance(body, dict):
        raise ValueError("not a [kind, body] message")
    return kind, body


_UNDECODABLE = object()  # an event payload that could not be decoded: counted as handled, not delivered


def _unpack_payload(data: Any) -> Any:
    """An event's payload travels msgpack-encoded inside the message (the agent encodes it once)."""
    if isinstance(data, bytes):
        return unpack(data)
    return data if data is not None else {}


def _quiet(fut: asyncio.Future[Any]) -> None:
    """A send nobody waits for: note a failure at debug level (and retrieve it, so asyncio does not warn)."""
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("a send to the manager failed: %s", fut.exception())


def _time_out(fut: asyncio.Future[Any]) -> None:
    """A call's time limit passed: its caller gets TimeoutError (as from asyncio.wait_for)."""
    if not fut.done():
        fut.set_exception(TimeoutError())


def _keepalive(sock: zmq.Socket[Any]) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 30)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 10)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)


async def _cancel(tasks: list[asyncio.Task[Any] | None]) -> None:
    await cancel_and_wait(*(t for t in tasks if t is not None and not t.done()))


# -- streams ------------------------------------------------------------------------------------------

CREDIT_BATCH = max(1, WINDOW // 4)  # frames taken before the receiver returns credit (at once when it caught up)


class _ZmqStream(LinkStream):
    """One end of a stream over the ZeroMQ link; `post` hands a message to the socket without waiting (False
    when it cannot reach the other side). The link feeds `_arrived` / `_credited` / `_end` from its receive loop."""

    def __init__(self, stream_id: str, post: Callable[[bytes], bool], where: str) -> None:
        super().__init__(stream_id)
        self._post = post
        self._where = where  # for log lines: "agent a1" / "the manager"
        self._credit = WINDOW  # frames we may still send before the other side takes some
        self._owed = 0  # frames we took and have not credited yet
        self._wake = asyncio.Event()  # credit came, or the stream ended
        self.on_end: Callable[[_ZmqStream], None] | None = None  # the link forgets the stream

    async def send(self, frame: dict[str, Any]) -> None:
        data = _pack("stream-data", {"sid": self.id, "frame": frame})  # a frame that cannot travel fails here
        while self._credit <= 0 and self.closed_reason is None:
            self._wake.clear()
            await self._wake.wait()
        if self.closed_reason is not None:
            raise StreamClosed(self.closed_reason or "closed")
        self._credit -= 1
        if not self._post(data):
            self._end(f"{self._where} is not connected")
            raise StreamClosed(self.closed_reason or "closed")

    def _taken(self) -> None:
        if self.closed_reason is not None:
            return
        self._owed += 1
        if self._owed >= CREDIT_BATCH or self.inbox.empty():
            n, self._owed = self._owed, 0
            self._post(_pack("stream-credit", {"sid": self.id, "n": n}))

    async def close(self, reason: str = "") -> None:
        if self.closed_reason is None:
            self._end(reason)
            self._post(_pack("stream-close", {"sid": self.id, "reason": reason}))

    # -- fed by the link ----------------------------------------------------------------------------

    def _arrived(self, frame: Any) -> None:
        if self.closed_reason is not None:
            return  # sent before the other side heard that we closed
        if not isinstance(frame, dict):
            log.warning("stream %s from %s: a frame that is not a map; closing it", self.id, self._where)
            self._end("ProtocolError: a frame that is not a map")
            self._post(_pack("stream-close", {"sid": self.id, "reason": self.closed_reason}))
            return
        self.inbox.put_nowait(frame)
        if self.inbox.qsize() + self._owed > WINDOW:  # the other side ignored the flow control
            log.warning("stream %s from %s: more than %d frames in flight; closing it", self.id, self._where, WINDOW)
            self._end("ProtocolError: the sender ignored the flow control")
            self._post(_pack("stream-close", {"sid": self.id, "reason": self.closed_reason}))

    def _credited(self, n: Any) -> None:
        if isinstance(n, int) and 0 < n <= WINDOW:
            self._credit = min(self._credit + n, WINDOW)
            self._wake.set()

    def _end(self, reason: str) -> None:
        """End this end (the receiver sees None after what it has not taken, senders StreamClosed)."""
        if self.closed_reason is None:
            self._ended(reason)
        self._wake.set()
        if self.on_end is not None:
            on_end, self.on_end = self.on_end, None
            on_end(self)


def _stream_message(stream: _ZmqStream | None, kind: str, body: dict[str, Any], where: str) -> None:
    """stream-data / stream-credit / stream-close from the other side, to its stream (None: not open here)."""
    if stream is None:
        log.debug("%s from %s for an unknown stream %r: ignored", kind, where, body.get("sid"))
    elif kind == "stream-data":
        stream._arrived(body.get("frame"))
    elif kind == "stream-credit":
        stream._credited(body.get("n"))
    else:
        stream._end(str(body.get("reason") or ""))


def _end_all(streams: list[_ZmqStream], reason: str, post: bool = False) -> None:
    """End these streams; `post`: tell the other side too (when it still listens)."""
    for stream in streams:
        if post and stream.closed_reason is None:
            stream._post(_pack("stream-close", {"sid": stream.id, "reason": reason}))
        stream._end(reason)


# -- manager ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Join:
    """A registration to hand to the manager."""

    rid: bytes
    link: str
    attempt: str
    registration: dict[str, Any]


@dataclass(frozen=True)
class _EventIn:
    """An event of the agent's link object `link`, number `seq`."""

    link: str
    seq: int
    name: str
    payload: Any  # _UNDECODABLE when it could not be decoded
    ack_wanted: bool


@dataclass(frozen=True)
class _Beat:
    payload: dict[str, Any]


@dataclass(frozen=True)
class _Left:
    reason: str  # closed | lost


_Delivery = _Join | _EventIn | _Beat | _Left  # what one agent's pump hands to the manager, in order


@dataclass
class _Peer:
    """What the manager knows of one agent id."""

    agent_id: str
    rid: bytes  # where to send: the routing id of its registered link object
    queue: asyncio.Queue[_Delivery] = field(default_factory=asyncio.Queue)
    pump: asyncio.Task[None] | None = None
    registered: bool = False
    link: str | None = None  # the agent link object whose events we count
    received: int = 0  # every event up to this seq is queued for delivery (or was delivered)
    handled: int = 0  # every event up to this seq was delivered
    acked: int = 0  # the last ack sent
    last_seen: float = 0.0
    joining: str | None = None  # the register attempt queued for the handler
    answered: tuple[str, str, dict[str, Any]] | None = None  # (link, attempt, answer) of the last registration
    resend_asked: tuple[int, float] = (-1, 0.0)
    replaced: deque[str] = field(default_factory=lambda: deque(maxlen=8))  # earlier links of this agent id


class ZmqManagerLink:
    """The manager's side: a CURVE ROUTER that agents register with."""

    def __init__(self, bind: str, secrets: ManagerSecrets, heartbeat_timeout: float = 9.0) -> None:
        if "://" not in bind:
            bind = f"tcp://{bind}"
        if bind.endswith(":0"):
            bind = bind[:-2] + ":*"  # any free port; see .endpoint after start()
        self.bind = bind
        self.secrets = secrets
        self.heartbeat_timeout = heartbeat_timeout
        self.endpoint: str | None = None
        self.handler: ManagerHandler | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._fd: int | None = None  # the socket's ZMQ_FD, watched by the event loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_scheduled = False
        self._peers: dict[str, _Peer] = {}  # by agent id
        self._by_rid: dict[bytes, _Peer] = {}  # the routing ids of registered link objects
        self._pending: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self._next_call = 0
        self._nudged: dict[bytes, float] = {}
        self._refused_logged_at = -1e9
        self._refusals_unlogged = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._streams: dict[str, _ManagerStream] = {}  # open streams, by id
        self._closed = False
        self._monitor: zmq.Socket[Any] | None = None  # libzmq's events of the ROUTER (dropped connections)
        self._dropped = 0  # connections dropped since the last log line
        self._drop_logged_at = -1e9

    async def start(self, handler: ManagerHandler) -> None:
        self.handler = handler
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        _keepalive(sock)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to an unknown peer fails instead of vanishing
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting agent takes its routing id over at once
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_TO_MANAGER)  # a larger message drops its connection
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)  # no handshake in time: dropped (libzmq's 30 s by default)
        ivl = max(1000, int(self.heartbeat_timeout * 1000 / 3))
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)  # ZMTP pings: drop dead connections
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl)
        sock.curve_secretkey = self.secrets.secret_key.encode("ascii")
        sock.curve_publickey = self.secrets.public_key.encode("ascii")
        sock.curve_server = True
        try:
            sock.bind(self.bind)
        except zmq.ZMQError as e:
            sock.close(linger=0)
            self._ctx.term()
            self._ctx = None
            raise OSError(e.errno, f"cannot bind {self.bind}: {e.strerror}") from None
        self._sock = sock
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._loop = asyncio.get_running_loop()
        self._fd = cast(int, sock.getsockopt(zmq.FD))
        self._loop.add_reader(self._fd, self._readable)
        self._watch_disconnects(sock)
        self._tasks = [asyncio.create_task(self._watch_liveness(), name="zmq-manager-liveness")]
        log.info("agent link listening on %s", self.endpoint)

    # -- calls --------------------------------------------------------------------------------------

    async def call(self, agent_id: str, method: str, args: dict[str, Any], timeout: float | None = None) -> Any:
        peer = self._peers.get(agent_id)
        if peer is None or not peer.registered or self._closed:
            raise AgentUnavailable(f"agent {agent_id} is not connected")
        self._next_call += 1
        call_id = self._next_call
        data = _pack("call", {"id": call_id, "method": method, "args": args})
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[call_id] = (agent_id, fut)
        # the time limit is a timer on the call's own future (asyncio.wait_for would add a task-like wrapper
        # and callbacks per call)
        timer = loop.call_later(timeout, _time_out, fut) if timeout is not None else None
        try:
            if not self._send_now(peer.rid, data):
                raise AgentUnavailable(f"agent {agent_id} is not connected")
            return await fut
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(call_id, None)

    def connected(self) -> set[str]:
        return {aid for aid, peer in self._peers.items() if peer.registered}

    # -- streams ------------------------------------------------------------------------------------

    async def open_stream(self, agent_id: str, kind: str, args: dict[str, Any]) -> LinkStream:
        peer = self._peers.get(agent_id)
        if peer is None or not peer.registered or self._closed:
            raise AgentUnavailable(f"agent {agent_id} is not connected")
        rid = peer.rid
        stream = _ManagerStream(secrets.token_hex(8), agent_id, rid, lambda data: self._send_now(rid, data))
        data = _pack("stream-open", {"sid": stream.id, "kind": kind, "args": args})
        if not self._send_now(rid, data):
            raise AgentUnavailable(f"agent {agent_id} is not connected")
        self._streams[stream.id] = stream
        stream.on_end = self._forget_stream
        return stream

    def _forget_stream(self, stream: _ZmqStream) -> None:
        if self._streams.get(stream.id) is stream:
            del self._streams[stream.id]

    def _end_streams(self, agent_id: str, reason: str) -> None:
        """End the agent's open streams, telling it (if it still listens)."""
        mine: list[_ZmqStream] = [s for s in self._streams.values() if s.agent_id == agent_id]
        if mine:
            log.info("ending %d stream(s) of agent %s: %s", len(mine), agent_id, reason)
            _end_all(mine, reason, post=True)

    # -- sending ------------------------------------------------------------------------------------

    def _send_now(self, rid: bytes, data: bytes) -> bool:
        """Send without waiting; False when the peer is gone or its queue is full."""
        sock = self._sock
        if sock is None:
            return False
        try:
            _raw_send(sock, rid, _MORE_NOBLOCK)
            _raw_send(sock, data, _NOBLOCK)
        except zmq.ZMQError as e:  # EHOSTUNREACH (ROUTER_MANDATORY: not connected) or EAGAIN (queue full)
            log.debug("cannot send to %r: %s", rid, e)
            return False
        finally:
            # a send may take the socket's "readable" signal (ZMQ_FD is edge-triggered): look for input
            # once this turn of the loop is over
            if not self._drain_scheduled and self._loop is not None:
                self._drain_scheduled = True
                self._loop.call_soon(self._readable)
        return True

    def _send(self, rid: bytes, kind: str, body: dict[str, Any]) -> bool:
        return self._send_now(rid, _pack(kind, body))

    # -- receiving ----------------------------------------------------------------------------------

    def _readable(self) -> None:
        """The event loop saw the socket's signal (or a send may have taken it): take what is in, up to
        RECV_BATCH messages, then look again in the next turn if more may be waiting."""
        self._drain_scheduled = False
        sock = self._sock
        if sock is None:
            return
        for _ in range(RECV_BATCH):
            try:
                frames = [_raw_recv(sock, _NOBLOCK)]
                while sock.getsockopt(_RCVMORE):
                    frames.append(_raw_recv(sock, _NOBLOCK))
            except zmq.Again:
                return  # all taken; the socket signals again when more comes
            except zmq.ZMQError as e:
                if self._sock is not None:
                    log.warning("receiving from the agent link failed: %s", e)
                return
            self._received(frames)
            if self._sock is None:  # closed by what the message did
                return
        if not self._drain_scheduled:  # more may be waiting: after the other callbacks of this turn
            self._drain_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._readable)

    def _received(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            log.warning("ignoring a message of %d frames from %r", len(frames), frames[0] if frames else None)
            return
        rid, data = frames
        try:
            kind, body = _unpack(data)
            self._dispatch(rid, kind, body)
        except Exception:
            log.exception("bad message from %r", rid)

    def _dispatch(self, rid: bytes, kind: str, body: dict[str, Any]) -> None:
        if kind == "register":
            self._on_register(rid, body)
            return
        peer = self._by_rid.get(rid)  # only a registration (with the token) makes a routing id known
        if peer is None or not peer.registered:
            if kind == "bye":
                self._send(rid, "bye-ack", {})
            elif kind != "reply":  # a late reply of a forgotten call needs no answer
                self._nudge(rid)
            return
        peer.last_seen = time.monotonic()
        if kind.startswith("stream-"):  # not events: straight to the stream, not through the pump
            self._on_stream(peer, rid, kind, body)
        elif kind == "event":
            self._on_event(peer, body)
        elif kind == "heartbeat":
            self._on_heartbeat(peer, body)
        elif kind == "reply":
            self._on_reply(peer, body)
        elif kind == "bye":
            self._drop(peer, "closed")
        else:
            log.warning("unknown message %r from agent %s", kind, peer.agent_id)

    def _on_stream(self, peer: _Peer, rid: bytes, kind: str, body: dict[str, Any]) -> None:
        sid = body.get("sid")
        stream = self._streams.get(sid) if isinstance(sid, str) else None
        if stream is not None and stream.rid != rid:
            stream = None  # not this link object's stream
        _stream_message(stream, kind, body, f"agent {peer.agent_id}")

    def _nudge(self, rid: bytes) -> None:
        """Ask a peer we do not have registered (we restarted, or declared it lost) to register."""
        now = time.monotonic()
        if now - self._nudged.get(rid, 0.0) >= NUDGE_INTERVAL:
            self._nudged[rid] = now
            self._send(rid, "register-please", {})

    def _on_register(self, rid: bytes, body: dict[str, Any]) -> None:
        agent_id = body.get("agent_id")
        token = body.get("token")
        attempt = str(body.get("attempt", ""))
        if not isinstance(token, str) or not secrets.compare_digest(
            token.encode("utf-8"), self.secrets.join_token.encode("utf-8")
        ):
            self._log_refusal(rid, agent_id)
            self._send(rid, "refused", {"reason": "join token rejected by the manager", "attempt": attempt})
            return
        if not isinstance(agent_id, str) or not agent_id:
            log.warning("refused a registration from %r: no agent id", rid)
            self._send(rid, "refused", {"reason": "the registration has no agent id", "attempt": attempt})
            return
        link = str(body.get("link", ""))
        registration = body.get("registration") or {}
        peer = self._peers.get(agent_id)
        if peer is None:
            peer = self._peers[agent_id] = _Peer(agent_id, rid)
            peer.pump = asyncio.create_task(self._pump(peer), name=f"zmq-events-{agent_id}")
        peer.last_seen = time.monotonic()
        if peer.joining == attempt:
            return  # a retry of a registration the handler is working on
        if peer.registered and peer.rid == rid and peer.answered is not None and peer.answered[:2] == (link, attempt):
            self._send(rid, "registered", {"attempt": attempt, "answer": peer.answered[2]})  # a retry
            return
        peer.joining = attempt
        peer.queue.put_nowait(_Join(rid, link, attempt, registration))

    def _log_refusal(self, rid: bytes, agent_id: Any) -> None:
        """Log a refused registration; at most one line a second, so that a stranger cannot flood the log."""
        now = time.monotonic()
        if now - self._refused_logged_at < 1.0:
            self._refusals_unlogged += 1
            return
        more = f" ({self._refusals_unlogged} more refused since the last report)" if self._refusals_unlogged else ""
        log.warning("refused the registration of agent %r (routing id %r): wrong join token%s", agent_id, rid, more)
        self._refused_logged_at, self._refusals_unlogged = now, 0

    def _on_event(self, peer: _Peer, body: dict[str, Any]) -> None:
        if peer.link is None or body.get("link") != peer.link:
            return  # from an earlier link object of this agent (it restarted)
        seq, low = int(body["seq"]), int(body.get("low", 0))
        if low - 1 > peer.received:
            if peer.received:
                log.warning("agent %s dropped events %d..%d", peer.agent_id, peer.received + 1, low - 1)
            peer.received = low - 1
        if seq <= peer.received:
            return  # a duplicate after a resend
        if seq > peer.received + 1:
            self._ask_resend(peer)  # a gap: what came in between was lost on the way
            return
        peer.received = seq
        name = body.get("name", "")
        try:
            payload = _unpack_payload(body.get("payload"))
        except Exception:
            log.exception("event %s (seq %d) from agent %s cannot be decoded; skipped", name, seq, peer.agent_id)
            payload = _UNDECODABLE
        peer.queue.put_nowait(_EventIn(peer.link, seq, name, payload, bool(body.get("ack_wanted"))))

    def _on_heartbeat(self, peer: _Peer, body: dict[str, Any]) -> None:
        peer.queue.put_nowait(_Beat(body.get("payload") or {}))
        if body.get("link") != peer.link:
            return
        low = int(body.get("low", 0))
        if low - 1 > peer.received:
            peer.received = low - 1
        if int(body.get("sent", 0)) > peer.received:
            self._ask_resend(peer)  # it sent events before this heartbeat that never came
        self._send(peer.rid, "ack", {"link": peer.link, "seq": peer.handled})  # repairs a lost ack

    def _ask_resend(self, peer: _Peer) -> None:
        now = time.monotonic()
        asked_for, asked_at = peer.resend_asked
        if asked_for != peer.received or now - asked_at >= RESEND_ASK_INTERVAL:
            peer.resend_asked = (peer.received, now)
            log.debug("asking agent %s to send its events again from %d", peer.agent_id, peer.received + 1)
            self._send(peer.rid, "resend", {"link": peer.link, "from": peer.received + 1})

    def _on_reply(self, peer: _Peer, body: dict[str, Any]) -> None:
        entry = self._pending.get(body.get("id"))  # type: ignore[arg-type]
        if entry is None or entry[1].done() or entry[0] != peer.agent_id:
            return  # timed out meanwhile (or not this agent's call)
        fut = entry[1]
        if body.get("ok"):
            fut.set_result(body.get("result"))
        else:
            fut.set_exception(RemoteError(str(body.get("kind", "Exception")), str(body.get("message", ""))))

    def _drop(self, peer: _Peer, reason: str) -> None:
        """The agent closed its link or went silent: forget it (its events still get delivered)."""
        peer.registered = False
        peer.answered = None
        why = "closed its link" if reason == "closed" else "is lost"
        for call_id, (aid, fut) in list(self._pending.items()):
            if aid == peer.agent_id and not fut.done():
                fut.set_exception(AgentUnavailable(f"agent {aid} {why}"))
                self._pending.pop(call_id, None)
        self._end_streams(peer.agent_id, f"agent {peer.agent_id} {why}")
        peer.queue.put_nowait(_Left(reason))

    async def _watch_liveness(self) -> None:
        tick = min(1.0, self.heartbeat_timeout / 5)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for peer in list(self._peers.values()):
                if peer.registered and now - peer.last_seen > self.heartbeat_timeout:
                    log.warning("agent %s is lost: nothing heard for %.1f s", peer.agent_id, now - peer.last_seen)
                    self._drop(peer, "lost")
            for rid, at in list(self._nudged.items()):
                if now - at > 10 * NUDGE_INTERVAL:
                    del self._nudged[rid]

    # -- delivering ---------------------------------------------------------------------------------

    async def _pump(self, peer: _Peer) -> None:
        """One agent's registrations, events, heartbeats and departures, in order, one at a time."""
        while True:
            item = await peer.queue.get()
            try:
                await self._deliver(peer, item)
            except Exception:  # a bad event must not stop the pump
                what = item.name if isinstance(item, _EventIn) else type(item).__name__.strip("_").lower()
                log.exception("%s from agent %s failed", what, peer.agent_id)
            # acknowledge what was handled: at once when asked, else at the end of a burst or every ACK_EVERY
            urgent = isinstance(item, _EventIn) and item.ack_wanted
            if peer.handled > peer.acked and (urgent or peer.queue.empty() or peer.handled - peer.acked >= ACK_EVERY):
                peer.acked = peer.handled
                self._send(peer.rid, "ack", {"link": peer.link, "seq": peer.handled})

    async def _deliver(self, peer: _Peer, item: _Delivery) -> None:
        assert self.handler is not None
        if isinstance(item, _EventIn):
            try:
                if item.payload is not _UNDECODABLE:
                    await self.handler.agent_event(peer.agent_id, item.name, item.payload)
            finally:
                if item.link == peer.link:
                    peer.handled = max(peer.handled, item.seq)
        elif isinstance(item, _Beat):
            await self.handler.agent_event(peer.agent_id, "heartbeat", item.payload)
        elif isinstance(item, _Join):
            rid, link, attempt, registration = item.rid, item.link, item.attempt, item.registration
            try:
                answer = await self.handler.agent_joined(peer.agent_id, registration)
            except Exception as e:
                log.exception("registering agent %s failed", peer.agent_id)
                peer.joining = None
                reason = f"registration failed: {type(e).__name__}: {e}"
                self._send(rid, "refused", {"reason": reason, "attempt": attempt})
                return
            if peer.link != link:  # a new link object (the agent restarted): its events count from 1
                if link in peer.replaced:  # a link we had replaced came back: they take turns
                    log.warning("two live agents register as %s: give each its own agent id", peer.agent_id)
                if peer.link is not None:
                    peer.replaced.append(peer.link)
                peer.link, peer.received, peer.handled, peer.acked = link, 0, 0, 0
            if self._by_rid.get(peer.rid) is peer:
                del self._by_rid[peer.rid]
            # a registration comes from a new link object (a restarted agent), or from one that the manager
            # dropped or forgot: the streams the agent had are gone on its side too
            self._end_streams(peer.agent_id, f"agent {peer.agent_id} registered again")
            peer.rid = rid
            self._by_rid[rid] = peer
            peer.joining = None
            peer.registered = True
            peer.last_seen = time.monotonic()
            peer.answered = (link, attempt, answer)
            self._nudged.pop(peer.rid, None)
            log.info("agent %s registered", peer.agent_id)
            self._send(peer.rid, "registered", {"attempt": attempt, "answer": answer})
        else:
            reason = item.reason
            try:
                await self.handler.agent_left(peer.agent_id, reason)
            finally:
                if reason == "closed":  # everything before the bye was handled: say so
                    self._send(peer.rid, "bye-ack", {"link": peer.link, "seq": peer.handled})

    # -- closing ------------------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _end_all(list(self._streams.values()), "the link is closed", post=True)
        await _cancel([*self._tasks, *(p.pump for p in self._peers.values())])
        for _, fut in self._pending.values():
            if not fut.done():
                fut.set_exception(AgentUnavailable("the manager link is closed"))
        self._pending.clear()
        for peer in self._peers.values():
            peer.registered = False
        if self._fd is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._fd = None
        self._close_monitor()
        self._sock, self._ctx = _close_zmq(self._sock, self._ctx)

    # -- dropped connections ----------------------------------------------------------------------------

    def _watch_disconnects(self, sock: zmq.Socket[Any]) -> None:
        """Log (at most every DROP_LOG_EVERY seconds) when libzmq drops a connection: an agent that closed or
        was cut off, or a peer that sent a message over MAX_MESSAGE_TO_MANAGER bytes (libzmq gives no reason)."""
        try:
            self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        except zmq.ZMQError as e:  # a libzmq without monitoring: the drops go unlogged, nothing else changes
            log.debug("cannot monitor the agent link: %s", e)
            return
        assert self._loop is not None
        self._loop.add_reader(cast(int, self._monitor.getsockopt(zmq.FD)), self._monitor_readable)
        self._loop.call_soon(self._monitor_readable)  # ZMQ_FD is edge-triggered: take what came before

    def _monitor_readable(self) -> None:
        mon = self._monitor
        while mon is not None:
            try:
                mon.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except zmq.ZMQError:
                return
            self._dropped += 1
        now = time.monotonic()
        if self._dropped and now - self._drop_logged_at >= DROP_LOG_EVERY:
            log.info(
                "%d agent link connection(s) dropped (an agent closed or was cut off, or a peer sent a message "
                "over %d MiB)",
                self._dropped,
                MAX_MESSAGE_TO_MANAGER >> 20,
            )
            self._dropped, self._drop_logged_at = 0, now

    def _close_monitor(self) -> None:
        mon, self._monitor = self._monitor, None
        if mon is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(Exception):
                self._loop.remove_reader(cast(int, mon.getsockopt(zmq.FD)))
        if self._sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
        mon.close(linger=0)


class _ManagerStream(_ZmqStream):
    """The manager's end of a stream to one agent link object (routing id `rid`)."""

    def __init__(self, stream_id: str, agent_id: str, rid: bytes, post: Callable[[bytes], bool]) -> None:
        super().__init__(stream_id, post, f"agent {agent_id}")
        self.agent_id = agent_id
        self.rid = rid


def _close_zmq(sock: Any, ctx: Any) -> tuple[None, None]:
    """Close a link's socket (dropping unsent messages) and terminate its context."""
    if sock is not None:
        sock.close(linger=0)
    if ctx is not None:
        ctx.term()
    return None, None


# -- agent --------------------------------------------------------------------------------------------


@dataclass
class _Event:
    name: str
    payload: bytes  # msgpack, encoded once when the event is emitted (a snapshot; resends reuse it)
    ack_wanted: bool


class ZmqAgentLink:
    """An agent's side: a CURVE DEALER that registers with the manager, answers calls, sends events."""

    def __init__(
        self,
        agent_id: str,
        manager_endpoint: str,
        manager_public_key: str,
        join_token: str,
        heartbeat_interval: float = 3.0,
        join_timeout: float = 30.0,
        close_timeout: float = 5.0,
        max_buffered: int = MAX_BUFFERED_EVENTS,
    ) -> None:
        self.agent_id = agent_id
        self.manager_endpoint = manager_endpoint
        self.manager_public_key = manager_public_key
        self.join_token = join_token
        self.heartbeat_interval = heartbeat_interval
        self.join_timeout = join_timeout
        self.close_timeout = close_timeout
        self.max_buffered = max_buffered
        # the routing id is "AGENT_ID.LINK_ID": readable in logs, and unguessable, so that no other CURVE client
        # (the manager's key is public) can take it over; CURVE encrypts it on the wire
        self.link_id = secrets.token_urlsafe(12)  # also: events are numbered per link object
        self.routing_id = f"{agent_id}.{self.link_id}".encode()
        if not agent_id or len(self.routing_id) > 255:
            raise ValueError(f"agent id {agent_id!r} must be 1..200 bytes")
        self.handler: AgentHandler | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._registered = False
        self._closed = False
        # events: seq -> event, for every seq in [_low, _seq]; _send_from is the next one to send
        self._events: dict[int, _Event] = {}
        self._seq = 0
        self._low = 1
        self._send_from = 1
        self._dropped = 0
        self._buffered_bytes = 0
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._wake_sender = asyncio.Event()
        self._drained = asyncio.Event()  # set while every event was handed to the socket
        self._attempt: str | None = None
        self._answer: asyncio.Future[dict[str, Any]] | None = None
        self._bye_ack: asyncio.Future[None] | None = None
        self._receive_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._sender_task: asyncio.Task[None] | None = None
        self._rejoin_task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self._streams: dict[str, _ZmqStream] = {}  # streams the manager opened, by id
        self._stream_tasks: set[asyncio.Task[None]] = set()  # their handlers

    # -- joining ------------------------------------------------------------------------------------

    async def join(self, handler: AgentHandler) -> dict[str, Any]:
        assert self.handler is None, "join() once per link"
        self.handler = handler
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.DEALER)
        _keepalive(sock)
        sock.setsockopt(zmq.ROUTING_ID, self.routing_id)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_TO_AGENT)  # a larger message drops the connection
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        ivl = max(1000, int(self.heartbeat_interval * 1000))
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)  # ZMTP pings: notice a dead connection and reconnect
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl)
        public, secret = zmq.curve_keypair()
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.curve_serverkey = self.manager_public_key.encode("ascii")
        sock.connect(self.manager_endpoint)
        self._sock = sock
        self._receive_task = asyncio.create_task(self._receive(), name="zmq-agent-receive")
        try:
            answer = await self._register(deadline=time.monotonic() + self.join_timeout)
        except BaseException:
            await self._shutdown()
            raise
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop(), name="zmq-agent-heartbeat")
        self._sender_task = asyncio.create_task(self._send_events(), name="zmq-agent-events")
        self._accepted()
        return answer

    async def _register(self, deadline: float | None) -> dict[str, Any]:
        """Send register until the manager answers; the answer, or LinkRefused / LinkUnavailable."""
        assert self.handler is not None and self._sock is not None
        self._registered = False
        registration = await self.handler.registration()
        self._attempt = attempt = secrets.token_hex(6)
        self._answer = answer = asyncio.get_running_loop().create_future()
        data = _pack(
            "register",
            {
                "agent_id": self.agent_id,
                "token": self.join_token,
                "link": self.link_id,
                "attempt": attempt,
                "registration": registration,
            },
        )
        while True:
            if deadline is None:
                await self._sock.send_multipart([data])
            else:  # the queue to a manager that never came up may be full
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._sock.send_multipart([data]), max(deadline - time.monotonic(), 0.01))
            wait = REGISTER_RETRY if deadline is None else min(REGISTER_RETRY, deadline - time.monotonic())
            try:
                return await asyncio.wait_for(asyncio.shield(answer), max(wait, 0.0))
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise LinkUnavailable(
                        f"no manager answered at {self.manager_endpoint} within {self.join_timeout:g} s"
                    ) from None

    def _accepted(self) -> None:
        """Registered: send every unacknowledged event again, in order."""
        self._registered = True
        self._send_from = self._low
        self._wake_sender.set()

    async def _rejoin(self) -> None:
        """The manager asked us to register again (it restarted, or had declared us lost)."""
        assert self.handler is not None
        log.info("the manager asked agent %s to register again", self.agent_id)
        while True:
            try:
                answer = await self._register(deadline=None)
                break
            except LinkRefused as e:
                log.error("the manager refused agent %s: %s; trying again in %g s", self.agent_id, e, REFUSED_RETRY)
                await asyncio.sleep(REFUSED_RETRY)
            except Exception:
                log.exception("re-registering agent %s failed; trying again", self.agent_id)
                await asyncio.sleep(REGISTER_RETRY)
        self._accepted()
        try:
            await self.handler.rejoined(answer)
        except Exception:
            log.exception("reconciling agent %s after re-registration failed", self.agent_id)

    # -- events -------------------------------------------------------------------------------------

    def _enqueue(self, name: str, payload: dict[str, Any], ack_wanted: bool) -> int:
        if self._closed:
            raise LinkUnavailable("the agent link is closed")
        data = pack(payload)  # a payload that cannot travel fails here
        self._seq += 1
        self._events[self._seq] = _Event(name, data, ack_wanted)
        self._buffered_bytes += len(data)
        self._drained.clear()
        while len(self._events) > self.max_buffered or (
            self._buffered_bytes > MAX_BUFFERED_BYTES and len(self._events) > 1
        ):
            self._forget(self._low)
            waiter = self._waiters.pop(self._low, None)
            if waiter is not None and not waiter.done():
                waiter.set_exception(LinkUnavailable("the event was dropped: too many unacknowledged events"))
            self._low += 1
            self._send_from = max(self._send_from, self._low)
            if self._dropped % 10_000 == 0:
                log.error(
                    "agent %s holds %d unacknowledged events (%d bytes): dropping the oldest (%d dropped so far)",
                    self.agent_id,
                    len(self._events),
                    self._buffered_bytes,
                    self._dropped + 1,
                )
            self._dropped += 1
        self._wake_sender.set()
        return self._seq

    async def emit(self, name: str, payload: dict[str, Any]) -> None:
        self._enqueue(name, payload, False)

    async def report(self, name: str, payload: dict[str, Any]) -> None:
        seq = self._enqueue(name, payload, True)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[seq] = waiter
        try:
            await waiter
        finally:
            self._waiters.pop(seq, None)

    async def _send_events(self) -> None:
        assert self._sock is not None
        while True:
            await self._wake_sender.wait()
            self._wake_sender.clear()
            sent = 0
            while self._registered and self._send_from <= self._seq and self._send_from - self._low < SEND_WINDOW:
                seq = max(self._send_from, self._low)
                self._send_from = seq + 1
                event = self._events.get(seq)
                if event is None:
                    continue
                body = {
                    "link": self.link_id,
                    "seq": seq,
                    "low": self._low,
                    "name": event.name,
                    "payload": event.payload,
                    "ack_wanted": event.ack_wanted,
                }
                await self._sock.send_multipart([_pack("event", body)])
                sent += 1
                if sent % SEND_BATCH == 0:
                    await asyncio.sleep(0)
            if self._registered and self._send_from > self._seq:
                self._drained.set()

    def _forget(self, seq: int) -> None:
        event = self._events.pop(seq, None)
        if event is not None:
            self._buffered_bytes -= len(event.payload)

    def _on_ack(self, seq: int) -> None:
        if seq >= self._low:
            self._wake_sender.set()  # the send window moved
        while self._low <= min(seq, self._seq):
            self._forget(self._low)
            self._low += 1
        if self._send_from < self._low:
            self._send_from = self._low
        for s in [s for s in self._waiters if s <= seq]:
            waiter = self._waiters.pop(s)
            if not waiter.done():
                waiter.set_result(None)

    # -- receiving ----------------------------------------------------------------------------------

    async def _receive(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart()
            try:
                kind, body = _unpack(frames[-1])
                self._dispatch(kind, body)
            except Exception:
                log.exception("bad message from the manager")

    def _dispatch(self, kind: str, body: dict[str, Any]) -> None:
        if kind == "call":
            task = asyncio.create_task(self._answer_call(body), name=f"zmq-call-{body.get('method')}")
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        elif kind == "stream-open":
            self._open_stream(body)
        elif kind in ("stream-data", "stream-credit", "stream-close"):
            sid = body.get("sid")
            _stream_message(self._streams.get(sid) if isinstance(sid, str) else None, kind, body, "the manager")
        elif kind == "ack":
            if body.get("link") == self.link_id:
                self._on_ack(int(body["seq"]))
        elif kind == "resend":
            if body.get("link") == self.link_id and self._registered:
                log.debug("the manager asks for the events from %s again", body["from"])
                self._send_from = max(self._low, min(self._send_from, int(body["from"])))
                self._wake_sender.set()
        elif kind == "registered":
            if self._answer is not None and not self._answer.done() and body.get("attempt") == self._attempt:
                self._answer.set_result(body.get("answer") or {})
        elif kind == "refused":
            if self._answer is not None and not self._answer.done() and body.get("attempt") == self._attempt:
                self._answer.set_exception(LinkRefused(str(body.get("reason", "refused by the manager"))))
        elif kind == "register-please":
            if self._registered and not self._closed and (self._rejoin_task is None or self._rejoin_task.done()):
                self._registered = False
                # the manager forgot this link (it restarted, or declared us lost): it forgot our streams too
                _end_all(list(self._streams.values()), "the manager asked the agent to register again")
                self._rejoin_task = asyncio.create_task(self._rejoin(), name="zmq-agent-rejoin")
        elif kind == "bye-ack":
            if body.get("link") == self.link_id:
                self._on_ack(int(body.get("seq", 0)))
            if self._bye_ack is not None and not self._bye_ack.done():
                self._bye_ack.set_result(None)
        else:
            log.warning("unknown message %r from the manager", kind)

    async def _answer_call(self, body: dict[str, Any]) -> None:
        assert self.handler is not None and self._sock is not None
        call_id = body.get("id")
        try:
            result = await self.handler.handle_call(str(body.get("method")), body.get("args") or {})
            data = _pack("reply", {"id": call_id, "ok": True, "result": result})
        except asyncio.CancelledError:
            raise
        except RemoteError as e:
            data = _pack("reply", {"id": call_id, "ok": False, "kind": e.kind, "message": e.message})
        except Exception as e:
            data = _pack("reply", {"id": call_id, "ok": False, "kind": type(e).__name__, "message": str(e)})
        await self._sock.send_multipart([data])

    def _post(self, data: bytes) -> bool:
        """Queue a message for the manager without waiting (the socket keeps the order of what it is given)."""
        if self._sock is None or self._closed:
            return False
        try:
            # (a future: the socket is an asyncio one)
            sent = cast("asyncio.Future[Any]", self._sock.send_multipart([data]))
        except zmq.ZMQError as e:
            log.debug("cannot send to the manager: %s", e)
            return False
        sent.add_done_callback(_quiet)
        return True

    def _open_stream(self, body: dict[str, Any]) -> None:
        sid, kind, args = body.get("sid"), str(body.get("kind", "")), body.get("args") or {}
        if not isinstance(sid, str) or sid in self._streams:
            log.debug("ignoring stream-open %r (%s): no id, or open already", sid, kind)
            return
        if self.handler is None or self._closed:
            self._post(_pack("stream-close", {"sid": sid, "reason": "the agent link is closed"}))
            return
        stream = _ZmqStream(sid, self._post, "the manager")
        self._streams[sid] = stream
        stream.on_end = self._forget_stream
        task = asyncio.create_task(self._serve_stream(kind, args, stream), name=f"zmq-stream-{kind}-{sid}")
        self._stream_tasks.add(task)
        task.add_done_callback(self._stream_tasks.discard)

    def _forget_stream(self, stream: _ZmqStream) -> None:
        if self._streams.get(stream.id) is stream:
            del self._streams[stream.id]

    async def _serve_stream(self, kind: str, args: dict[str, Any], stream: _ZmqStream) -> None:
        assert self.handler is not None
        try:
            await self.handler.handle_stream(kind, args, stream)
        except asyncio.CancelledError:
            stream._end(stream.closed_reason if stream.closed_reason is not None else "the agent link is closed")
            raise
        except Exception as e:  # the manager's end learns why it ended
            log.debug("stream %s (%s) failed: %s", stream.id, kind, e)
            await stream.close(f"{type(e).__name__}: {e}")
        else:
            await stream.close("")

    async def _heartbeat_loop(self) -> None:
        assert self.handler is not None and self._sock is not None
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            if not self._registered:
                continue  # re-registering: the register messages say we are alive
            body = {"link": self.link_id, "low": self._low, "sent": self._send_from - 1, "payload": {}}
            try:
                data = _pack("heartbeat", {**body, "payload": self.handler.heartbeat()})
            except Exception:
                log.exception("the heartbeat payload failed; sending an empty one")
                data = _pack("heartbeat", body)
            await self._sock.send_multipart([data])

    # -- closing ------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Send what is queued, say bye (the manager answers once it handled everything before it), stop."""
        if self._closed:
            return
        if self._registered and self._sock is not None:
            deadline = time.monotonic() + self.close_timeout
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), self.close_timeout)
            self._closed = True
            self._bye_ack = asyncio.get_running_loop().create_future()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._sock.send_multipart([_pack("bye", {})]), 1.0)
                await asyncio.wait_for(self._bye_ack, max(0.1, deadline - time.monotonic()))
        if self._events:
            log.warning("agent %s closes its link with %d unacknowledged events", self.agent_id, len(self._events))
        await self._shutdown()

    async def abort(self) -> None:
        """Drop the link the way a crash would: no bye, the manager notices by missing heartbeats."""
        await self._shutdown()

    async def _shutdown(self) -> None:
        self._closed = True
        self._registered = False
        _end_all(list(self._streams.values()), "the link is closed")  # their handlers see the end, then stop
        tasks = [self._receive_task, self._heartbeat_task, self._sender_task, self._rejoin_task, *self._calls]
        await _cancel([*tasks, *self._stream_tasks])
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(LinkUnavailable("the agent link is closed"))
        if self._answer is not None and not self._answer.done():
            self._answer.cancel()
        self._sock, self._ctx = _close_zmq(self._sock, self._ctx)


__all__ = ["ZmqManagerLink", "ZmqAgentLink", "LinkRefused", "LinkUnavailable", "AgentUnavailable", "RemoteError"]
