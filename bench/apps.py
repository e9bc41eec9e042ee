"""Apps through the tunnel (`bai session app`) against a direct connection to the same server, one run.

A Docker kernel of bai-python:3.11 serves /home/work with its `web` app (python -m http.server). The
kernel runs on the `bridge` network, so that its agent also publishes the app on 127.0.0.1 (the direct
path: Docker's port publishing); the tunnel goes CLI listener → WebSocket → manager → link stream →
agent → the kernel's runner → the server. Prints:

- download: a 100 MiB file, MiB/s direct and tunnelled (best of --runs), and the ratio (target ≥ 50 %);
- latency: small requests on one kept-alive connection, median direct and tunnelled, and the overhead
  (target ≤ 2 ms); also a new connection's set-up (each is a new tunnel), for information;
- concurrency: 20 tunnels at once, each downloading 5 MiB, all intact (target: 20 of 20);
- heartbeats: a split cluster (manager + Docker agent over ZeroMQ, heartbeat every 0.5 s): the largest
  gap between heartbeats the manager saw, idle and while a tunnel is saturated (target: under 2 × the
  interval while saturated).

    .venv/bin/python bench/apps.py [--runs 3]        (needs dockerd and bai-python:3.11 with its web app)
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.nodeproc import Cluster, Node, admin_keys, free_port, signed_request  # noqa: E402

MiB = 1 << 20
BRIDGE = '[scaling_groups.default]\nallowed_networks = ["bridge"]\n'
HEARTBEAT = 0.5
# Serves /home/work on the web app's port with HTTP/1.1 (kept-alive connections: python -m http.server,
# what the image's service definition starts, speaks HTTP/1.0). Started before the app is opened, so the
# app is found running.
KEEPALIVE_SERVER = r'''
import socket, subprocess, sys, time
code = """
import http.server
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # answers in pieces (headers, body) go out at once on either path
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""
subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", 8080), 1).close()
        break
    except OSError:
        time.sleep(0.05)
'''


def get(port: int, path: str, conn: http.client.HTTPConnection | None = None) -> bytes:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise SystemExit(f"GET {path} on port {port}: {resp.status}")
        return data
    finally:
        if own:
            conn.close()


def wait_listening(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            get(port, "/small")
            return
        except (OSError, http.client.HTTPException):
            time.sleep(0.2)
    raise SystemExit(f"nothing answers on 127.0.0.1:{port}")


def prepare(node, name: str, network: str | None) -> dict:
    args = ["session", "create", "--name", name, "--mem", "1g", *(("--network", network) if network else ()), "python"]
    node.cli(*args, check=True)
    code = (
        f"open('blob','wb').write(b'x'*{100 * MiB}); open('mid','wb').write(b'y'*{5 * MiB}); "
        "open('small','w').write('ok')"
    )
    node.cli("session", "exec", name, "-c", code, check=True, timeout=120)
    node.cli("session", "exec", name, "-c", KEEPALIVE_SERVER, check=True, timeout=60)
    return node.json("session", "info", name)


def tunnel(node, name: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    proc = node.popen("session", "app", name, "web", "--bind", f"127.0.0.1:{port}")
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise SystemExit(f"bai session app did not start: {url} {proc.stderr.read() if proc.stderr else ''}")
    wait_listening(port)
    return proc, port


def throughput(port: int, runs: int) -> float:
    best = 0.0
    for _ in range(runs):
        started = time.perf_counter()
        data = get(port, "/blob")
        took = time.perf_counter() - started
        assert len(data) == 100 * MiB
        best = max(best, len(data) / MiB / took)
    return best


def latency(port: int, count: int = 200) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/small")
    resp = conn.getresponse()
    resp.read()
    if resp.getheader("Connection", "").lower() == "close" or resp.version == 10:
        conn.close()
        return per_connection(port, count)  # an HTTP/1.0 server: every request is a new connection
    times = []
    for _ in range(count):
        started = time.perf_counter()
        get(port, "/small", conn)
        times.append(time.perf_counter() - started)
    conn.close()
    return statistics.median(times)


def per_connection(port: int, count: int = 100) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        get(port, "/small")
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def concurrent(port: int, tunnels: int = 20) -> int:
    with ThreadPoolExecutor(tunnels) as pool:
        results = list(pool.map(lambda _: get(port, "/mid"), range(tunnels)))
    return sum(1 for r in results if r == b"y" * (5 * MiB))


def heartbeat_gaps(cluster, seconds: float, load=None) -> float:
    """The largest gap between the agent's heartbeats as the manager recorded them (lastSeen), sampled
    every 20 ms through the API for `seconds`, while `load()` runs in a thread (if given)."""
    from datetime import datetime

    keys = admin_keys(cluster.manager)
    stop = threading.Event()
    worker = None
    if load is not None:

        def loop() -> None:
            while not stop.is_set():
                load()

        worker = threading.Thread(target=loop, daemon=True)
        worker.start()
    seen: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status, answer = signed_request(cluster.manager, "GET", "/bai/agents", *keys)
        assert status == 200, answer
        stamp = datetime.fromisoformat(answer["items"][0]["lastSeen"]).timestamp()
        if not seen or stamp != seen[-1]:
            seen.append(stamp)
        time.sleep(0.02)
    stop.set()
    if worker is not None:
        worker.join(120)
    return max((b - a for a, b in zip(seen, seen[1:], strict=False)), default=float("inf"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bai-bench-apps-"))

    node = Node(base / "node", "docker", extra_config=BRIDGE).start()
    try:
        info = prepare(node, "bench-web", "bridge")
        web = next(a for a in info["servicePorts"] if a["name"] == "web")
        proc, tport = tunnel(node, "bench-web")  # starts the app too
        direct = web["host_ports"][0]
        wait_listening(direct)
        try:
            d_tp, t_tp = throughput(direct, args.runs), throughput(tport, args.runs)
            d_lat, t_lat = latency(direct), latency(tport)
            d_conn, t_conn = per_connection(direct, 50), per_connection(tport, 50)
            ok = concurrent(tport)
        finally:
            proc.terminate()
            proc.wait(10)
        node.cli("session", "destroy", "bench-web", check=True)
    finally:
        node.stop()

    cluster = Cluster(base / "split", "docker").start()
    try:
        prepare(cluster, "bench-split", None)
        proc, sport = tunnel(cluster, "bench-split")
        try:
            idle_gap = heartbeat_gaps(cluster, 6)
            busy_gap = heartbeat_gaps(cluster, 12, load=lambda: get(sport, "/blob"))
            split_tp = throughput(sport, 1)
        finally:
            proc.terminate()
            proc.wait(10)
        cluster.cli("session", "destroy", "bench-split", check=True)
    finally:
        cluster.stop()

    def verdict(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    print(f"{'figure':44} {'direct':>12} {'tunnel':>12} {'ratio':>8}  target")
    print(
        f"{'100 MiB download (MiB/s, best of ' + str(args.runs) + ')':44} {d_tp:12.0f} {t_tp:12.0f} "
        f"{t_tp / d_tp:8.0%}  ≥ 50 % {verdict(t_tp >= 0.5 * d_tp)}"
    )
    print(
        f"{'small request, kept-alive (ms, median)':44} {d_lat * 1e3:12.2f} {t_lat * 1e3:12.2f} "
        f"{'+' + format((t_lat - d_lat) * 1e3, '.2f') + ' ms':>8}  ≤ +2 ms {verdict(t_lat - d_lat <= 0.002)}"
    )
    print(
        f"{'small request, new connection (ms, median)':44} {d_conn * 1e3:12.2f} {t_conn * 1e3:12.2f} "
        f"{'+' + format((t_conn - d_conn) * 1e3, '.2f') + ' ms':>8}  (a new tunnel each: for information)"
    )
    print(f"{'20 tunnels at once, 5 MiB each (intact)':44} {'':12} {ok:12d} {'':8}  20 {verdict(ok == 20)}")
    print(
        f"{'split cluster: largest heartbeat gap (s)':44} {idle_gap:12.2f} {busy_gap:12.2f} {'':8}  "
        f"idle vs saturated tunnel ({split_tp:.0f} MiB/s); < {2 * HEARTBEAT:g} s {verdict(busy_gap < 2 * HEARTBEAT)}"
    )


if __name__ == "__main__":
    main()
