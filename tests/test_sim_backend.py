"""The simulated backend: in-memory kernels for scale tests and benchmarks."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal
from typing import Any

import pytest

from bai.node.agent.agent import Agent
from bai.node.agent.backends.base import Kernel, KernelSpec
from bai.node.agent.backends.sim import SimBackend, SimChannel, parse_batch, simulate_query
from bai.node.link.inproc import InprocHub
from bai.node.link.messages import CreateKernel, DestroyKernel, Execute, UploadFiles, call


def spec(n: int = 0, image: str = "sim") -> KernelSpec:
    return KernelSpec(
        kernel_id=f"k-{n:05d}",
        session_id=f"s-{n:05d}",
        session_name=f"sess-{n}",
        access_key="AKTEST",
        image=image,
        slots={"cpu": Decimal("0.5"), "mem": Decimal(2**30)},
        environ={"FOO": "bar"},
    )


class Output:
    def __init__(self) -> None:
        self.chunks: list[tuple[str, str]] = []

    def __call__(self, kind: str, text: str) -> None:
        self.chunks.append((kind, text))


async def run(kernel: Kernel, mode: str, code: str, run_id: str = "r1", flush: float = 1.0) -> dict[str, Any]:
    await kernel.channel.start_run(run_id, mode, code)
    return (await kernel.channel.next_result(run_id, flush)).to_api()


@pytest.fixture
async def kernel():
    backend = SimBackend(start_delay=0)
    k = await backend.create(spec(), Output())
    yield k
    await backend.close([])


# -- creating -----------------------------------------------------------------------------------------


async def test_create_waits_the_start_delay_and_accepts_any_image():
    backend = SimBackend(start_delay=0.1)
    assert backend.name == "sim"
    assert [i["name"] for i in await backend.images()] == ["sim"]
    start = time.perf_counter()
    k = await backend.create(spec(image="bai-python:3.11"), Output())
    assert time.perf_counter() - start >= 0.095
    assert isinstance(k.channel, SimChannel)
    assert k.channel.supports_query
    assert not k.exited.done()
    assert k.spec.image == "bai-python:3.11"
    assert backend.occupied() == {"cpu": Decimal("0.5"), "mem": Decimal(2**30)}
    assert backend.environ(k)["FOO"] == "bar"
    assert await backend.adopt(Output()) == []
    await backend.destroy(k)
    assert k.exited.done() and k.destroying
    assert backend.occupied() == {}


async def test_create_cancelled_while_starting_leaves_nothing():
    backend = SimBackend(start_delay=10)
    task = asyncio.create_task(backend.create(spec(), Output()))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backend.kernels == {}


async def test_many_kernels_cheaply():
    backend = SimBackend(start_delay=0.01)
    start = time.perf_counter()
    kernels = await asyncio.gather(*(backend.create(spec(i), Output()) for i in range(2000)))
    elapsed = time.perf_counter() - start
    assert len(backend.kernels) == 2000
    assert elapsed < 1.0, f"2,000 kernels took {elapsed:.2f} s"
    results = await asyncio.gather(*(run(k, "batch", "true") for k in kernels))
    assert all(r["exitCode"] == 0 for r in results)
    start = time.perf_counter()
    await backend.close([])
    assert time.perf_counter() - start < 1.0
    assert backend.kernels == {} and all(k.exited.done() for k in kernels)


# -- query mode -----------------------------------------------------------------------------------


async def test_query_print_feeds_stdout(kernel: Kernel):
    result = await run(kernel, "query", "print('hello')")
    assert result["status"] == "finished"
    assert result["exitCode"] == 0
    assert result["console"] == [["stdout", "hello\n"]]
    assert kernel.channel.on_output.chunks == [("stdout", "hello\n")]
    assert (await run(kernel, "query", "print(42)", "r2"))["console"] == [["stdout", "42\n"]]
    assert (await run(kernel, "query", "print([1, 'a'])", "r3"))["console"] == [["stdout", "[1, 'a']\n"]]


@pytest.mark.parametrize(
    ("code", "exit_code", "stderr"),
    [
        ("raise SystemExit(3)", 3, ""),
        ("exit(5)", 5, ""),
        ("import sys; sys.exit(4)", 0, ""),  # two statements: not recognised, runs "fine"
        ("sys.exit(4)", 4, ""),
        ("raise SystemExit", 0, ""),
        ("exit()", 0, ""),
        ("raise SystemExit('bye')", 1, "bye\n"),
        ("x = 1 / 0", 0, ""),
        ("input()", 0, ""),
        ("print(open('/etc/passwd').read())", 0, ""),  # not a literal: never evaluated
        ("def (", 0, ""),
    ],
)
async def test_query_exit_codes(kernel: Kernel, code: str, exit_code: int, stderr: str):
    result = await run(kernel, "query", code)
    assert result["status"] == "finished"
    assert result["exitCode"] == exit_code
    assert result["console"] == ([["stderr", stderr]] if stderr else [])


def test_simulate_query_does_not_run_code():
    assert simulate_query("print(__import__('os').system('false'))") == ("", "", 0)
    assert simulate_query("print(1, 'two')") == ("1 two\n", "", 0)
    assert simulate_query("print()") == ("\n", "", 0)


# -- batch mode -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "exit_code", "console"),
    [
        ("true", 0, []),
        ("false", 1, []),
        ("exit 7", 7, []),
        ("exit", 0, []),
        ("exit 300", 44, []),
        ("exit x", 2, [["stderr", "exit: Illegal number: x\n"]]),
        ("echo hello   'big world'", 0, [["stdout", "hello big world\n"]]),
        ("python3 -c 'import sys; sys.exit(3)'", 0, []),
        ("", 0, []),
    ],
)
async def test_batch_commands(kernel: Kernel, command: str, exit_code: int, console: list):
    result = await run(kernel, "batch", command)
    assert (result["status"], result["exitCode"], result["console"]) == ("finished", exit_code, console)


def test_parse_batch():
    assert parse_batch("  sleep  0.5 ") == ("sleep", ["0.5"])
    assert parse_batch("echo 'unbalanced") == ("echo", ["'unbalanced"])


async def test_batch_sleep_finishes_after_its_time(kernel: Kernel):
    start = time.perf_counter()
    await kernel.channel.start_run("r1", "batch", "sleep 0.3")
    first = (await kernel.channel.next_result("r1", 0.05)).to_api()
    assert first["status"] == "continued"
    result = first
    while result["status"] != "finished":
        result = (await kernel.channel.next_result("r1", 1.0)).to_api()
    assert result["exitCode"] == 0
    assert 0.28 <= time.perf_counter() - start < 1.0
    # the kernel is free for the next run
    assert (await run(kernel, "batch", "false", "r2"))["exitCode"] == 1


async def test_bad_sleep_fails(kernel: Kernel):
    result = await run(kernel, "batch", "sleep forever")
    assert result["exitCode"] == 1


async def test_interrupt_ends_a_sleep_with_130(kernel: Kernel):
    await kernel.channel.start_run("r1", "batch", "sleep 30")
    assert (await kernel.channel.next_result("r1", 0.02)).to_api()["status"] == "continued"
    start = time.perf_counter()
    await kernel.channel.interrupt()
    result = (await kernel.channel.next_result("r1", 1.0)).to_api()
    assert result["status"] == "finished" and result["exitCode"] == 130
    assert time.perf_counter() - start < 0.5
    await kernel.channel.interrupt()  # nothing running: nothing happens
    assert (await run(kernel, "batch", "echo again", "r2"))["console"] == [["stdout", "again\n"]]


async def test_destroy_ends_a_running_run():
    backend = SimBackend(start_delay=0)
    k = await backend.create(spec(), Output())
    await k.channel.start_run("r1", "batch", "sleep 30")
    await backend.destroy(k)
    result = (await k.channel.next_result("r1", 1.0)).to_api()
    assert result["status"] == "finished" and result["exitCode"] == 137
    assert "destroyed" in result["console"][0][1]
    assert k.exited.result() == 137
    with pytest.raises(Exception, match="destroyed"):
        await k.channel.start_run("r2", "batch", "true")


async def test_put_file_is_recorded_and_discarded(kernel: Kernel):
    await kernel.channel.put_file("a/b.txt", b"x" * 1000)
    await kernel.channel.put_file("c.bin", b"")
    assert kernel.channel.files == ["a/b.txt", "c.bin"]


# -- with an agent --------------------------------------------------------------------------------


class Manager:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    async def agent_joined(self, agent_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        self.registration = registration
        return {"destroy": []}

    async def agent_event(self, agent_id: str, name: str, payload: dict[str, Any]) -> None:
        self.events.append((agent_id, name, payload))

    async def agent_left(self, agent_id: str, reason: str) -> None:
        pass


async def test_an_agent_runs_sim_kernels():
    hub = InprocHub()
    manager = Manager()
    await hub.manager.start(manager)
    agent = Agent("sim-a", SimBackend(start_delay=0.01), hub.agent_link("sim-a"), {"cpu": Decimal(8)})
    await agent.start()
    try:
        assert manager.registration["backend"] == "sim"
        assert manager.registration["images"][0]["name"] == "sim"
        create = CreateKernel("k1", "s1", "one", "AK", "python", {"cpu": "0.5"})
        created = await call(hub.manager, "sim-a", create)
        assert created.kernel_id == "k1" and created.query is True
        assert agent.heartbeat()["occupied_slots"] == {"cpu": "0.5"}
        result = await call(hub.manager, "sim-a", Execute("k1", "r", "batch", options={"exec": "echo hi"}))
        assert result.exit_code == 0 and result.console == [["stdout", "hi\n"]]
        await call(hub.manager, "sim-a", UploadFiles("k1", [["f.txt", b"data"]]))
        assert (await call(hub.manager, "sim-a", DestroyKernel("k1"))).existed is True
        assert agent.kernels == {}
        for _ in range(100):  # the echo went to the log (events are delivered by the link's pump)
            if any(name == "kernel_logs" for _, name, _ in manager.events):
                break
            await asyncio.sleep(0.01)
        assert [p["chunks"] for _, name, p in manager.events if name == "kernel_logs"] == [[["k1", "hi\n"]]]
    finally:
        await agent.stop()
        await hub.manager.close()


async def test_a_sim_channel_takes_a_files_mode_as_every_channel_does():
    """Channel.put_file(path, data, mode): the simulated channel refused the mode (TypeError; found by mypy)."""
    channel = SimChannel(lambda kind, text: None)
    await channel.put_file("/home/work/.bashrc", b"", 0o600)
    await channel.put_file("/home/work/notes.txt", b"x")
    assert channel.files == ["/home/work/.bashrc", "/home/work/notes.txt"]
