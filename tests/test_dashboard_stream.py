"""The manager's dashboard stream `GET /bai/events`: snapshot, session and agent changes, kernel logs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from bai.client.api import APIError
from tests.nodeproc import Node
from tests.tui_support import collect, node_client


@pytest.fixture(scope="module")
def sim_node(tmp_path_factory) -> Iterator[Node]:
    node = Node(tmp_path_factory.mktemp("dash"), "sim", agent_config='cpu = "4"\nmem = "8g"\n').start()
    yield node
    node.stop()


async def test_snapshot_then_changes_of_sessions_and_agents(sim_node: Node) -> None:
    client = node_client(sim_node)
    sim_node.cli("session", "create", "--name", "snap-running", "--cpu", "1", "sim", check=True)
    stream = client.dashboard_events()
    name, snap = await anext(stream)
    assert name == "snapshot"
    running = {s["name"]: s for s in snap["sessions"]}["snap-running"]
    assert running["status"] == "RUNNING" and running["agent"] == sim_node.agent_id
    assert running["requestedSlots"]["cpu"] == "1"
    (agent,) = [a for a in snap["agents"] if a["id"] == sim_node.agent_id]
    assert agent["availableSlots"] == {"cpu": "4", "mem": str(8 * 1024**3)}
    before = float(agent["occupiedSlots"].get("cpu", "0"))

    # one that fits the agent only when nothing else runs there (all 4 cores; snap-running holds one), one
    # that fits now: the first waits with a reason, the second runs, and the agent's occupied cpu grows by
    # what the second holds
    sim_node.cli("session", "create", "--name", "snap-huge", "--cpu", "4", "--no-wait", "sim", check=True)
    sim_node.cli("session", "create", "--name", "snap-two", "--cpu", "2", "sim", check=True)
    seen: dict[str, dict] = {}
    cpu = [before]

    def done(name: str, data: dict) -> bool:
        if name == "sessions":
            seen.update({s["name"]: s for s in data["items"]})
        if name == "agents":
            cpu.extend(float(a["occupiedSlots"].get("cpu", "0")) for a in data["items"] if a["id"] == sim_node.agent_id)
        return (
            seen.get("snap-two", {}).get("status") == "RUNNING"
            and bool(seen.get("snap-huge", {}).get("reason"))
            and cpu[-1] == before + 2
        )

    await collect(stream, done)
    huge = seen["snap-huge"]
    assert huge["status"] == "PENDING" and huge["queuePosition"] == 1
    assert huge["reason"].startswith("no-available-instances") and "of 4 requested" in huge["reason"]
    await stream.aclose()
    for name in ("snap-running", "snap-huge", "snap-two"):
        sim_node.cli("session", "destroy", name, check=True)


async def test_users_see_only_their_sessions(sim_node: Node) -> None:
    user = sim_node.json("keypair", "create", "--user", "dash-user")
    sim_node.cli("session", "create", "--name", "admins-own", "sim", check=True)
    sim_node.cli("session", "create", "--name", "users-own", "sim", check=True, as_keypair=user)
    client = node_client(sim_node, user)
    name, snap = await anext(client.dashboard_events())
    assert name == "snapshot"
    assert [s["name"] for s in snap["sessions"]] == ["users-own"]
    assert snap["agents"], "agents are visible to every user"
    sim_node.cli("session", "destroy", "admins-own", check=True)
    sim_node.cli("session", "destroy", "users-own", check=True, as_keypair=user)


async def test_logs_topic_sends_output_then_end_and_resumes_after_a_chunk(sim_node: Node) -> None:
    sim_node.cli(
        "session", "create", "--name", "dash-echo", "--type", "batch", "--startup-command", "echo hello dashboard",
        "--wait", "sim", check=True,
    )  # fmt: skip
    client = node_client(sim_node)
    events = await collect(client.dashboard_events(topics="logs", session="dash-echo"), lambda n, _: n == "log_end")
    logs = [e for e in events if e[0] == "log"]
    text = "".join(chunk[1] for _, data in logs for chunk in data["chunks"])
    assert text == "hello dashboard\n"
    seq, _, stored_at = logs[-1][1]["chunks"][-1]
    assert stored_at.startswith("20")  # a timestamp per chunk, for the `t` key
    after = await collect(
        client.dashboard_events(topics="logs", session="dash-echo", after=seq), lambda n, _: n == "log_end"
    )
    assert [n for n, _ in after] == ["log_end"], "nothing is sent twice after a reconnect"


async def test_bad_requests_get_a_problem_not_a_stream(sim_node: Node) -> None:
    client = node_client(sim_node)
    for kw, words in (
        ({"topics": "sessions,nope"}, "topics must be"),
        ({"topics": "logs"}, "needs session"),
        ({"topics": "logs,sessions"}, "stream of its own"),
        ({"topics": "sessions", "tail": -1}, "tail must be"),
    ):
        with pytest.raises(APIError) as err:
            await anext(client.dashboard_events(**kw))
        assert err.value.status == 400 and words in str(err.value)
    with pytest.raises(APIError) as err:
        await anext(client.dashboard_events(topics="logs", session="no-such-session"))
    assert err.value.status == 404


async def test_a_cancelled_reader_frees_its_thread_at_once(sim_node: Node) -> None:
    """Cancelling a reader blocked on a quiet stream must not leave its thread waiting for the next
    keep-alive (15 s): the dashboard has to quit at once."""
    sim_node.cli("session", "create", "--name", "dash-quiet", "sim", check=True)  # prints nothing
    client = node_client(sim_node)

    async def read() -> None:
        async for _ in client.dashboard_events(topics="logs", session="dash-quiet"):
            pass

    task = asyncio.create_task(read())
    await asyncio.sleep(1.0)  # blocked in a worker thread, reading an event that does not come
    assert not task.done()
    loop = asyncio.get_running_loop()
    started = loop.time()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(loop.shutdown_default_executor(), 10)
    assert loop.time() - started < 3
    sim_node.cli("session", "destroy", "dash-quiet", check=True)
