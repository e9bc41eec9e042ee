"""What the benchmarks share: a `bai node` subprocess in a throw-away folder, and its clean-up."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_LABEL = "bai.bench=1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class BenchNode:
    proc: subprocess.Popen[str]
    env: dict[str, str]
    folder: Path
    port: int

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        remove_bench_containers()


def start_node(config: str, backend: str, *extra: str) -> BenchNode:
    """Start `bai node` with `config` (TOML) on a free port; return once it says it is ready.

    Docker kernels it starts carry the label bai.bench=1, so `stop()` can remove what is left."""
    folder = Path(tempfile.mkdtemp(prefix="bai-bench-"))
    config_file = folder / "bai.toml"
    config_file.write_text(config + '\n[agent.docker]\nlabels = { "bai.bench" = "1" }\n')
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(folder / "config"),
        "XDG_DATA_HOME": str(folder / "data"),
        "BAI_CONFIG": str(config_file),
    }
    port = free_port()
    cmd = [sys.executable, "-m", "bai", "node", "--listen", f"127.0.0.1:{port}", "--state-dir", str(folder / "state")]
    cmd += ["--backend", backend, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("ready"):
            return BenchNode(proc, env, folder, port)
    raise SystemExit("the node did not start:\n" + "".join(seen))


def remove_bench_containers() -> None:
    try:
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label={BENCH_LABEL}"], capture_output=True, text=True
        )
    except FileNotFoundError:
        return
    if out.stdout.split():
        subprocess.run(["docker", "rm", "-f", *out.stdout.split()], capture_output=True)
