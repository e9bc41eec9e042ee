"""What the benchmarks share: a `bai node` subprocess in a throw-away folder, and its clean-up."""

from __future__ import annotations

import os
import shutil
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
        shutil.rmtree(self.folder, ignore_errors=True)  # (its state, configuration and logs)


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


# -- profiling a node process (bench/cluster.py --profile) ----------------------------------------------------


class StackSampler:
    """Wall-clock sampling of every thread's Python stack (sys._current_frames) from a thread of its own:
    where the event loop and the database's thread spend their time, waiting included."""

    def __init__(self, interval: float = 0.002) -> None:
        import threading

        self.interval = interval
        self.samples = 0
        self.leaf: dict[tuple[str, str], int] = {}  # (thread, function) -> samples where it is the innermost frame
        self.inside: dict[tuple[str, str], int] = {}  # (thread, function) -> samples where it is on the stack
        self.threads: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import threading

        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            self.samples += 1
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                thread = names.get(ident, str(ident))
                self.threads[thread] = self.threads.get(thread, 0) + 1
                seen: set[str] = set()
                first = True
                f = frame
                while f is not None:
                    code = f.f_code
                    where = f"{_short(code.co_filename)}:{code.co_firstlineno}({code.co_name})"
                    if first:
                        key = (thread, f"{where} line {f.f_lineno}")
                        self.leaf[key] = self.leaf.get(key, 0) + 1
                        first = False
                    if where not in seen:
                        seen.add(where)
                        self.inside[(thread, where)] = self.inside.get((thread, where), 0) + 1
                    f = f.f_back

    def report(self, top: int = 40) -> str:
        lines = [f"{self.samples} samples every {self.interval * 1000:g} ms (wall clock, every thread)"]
        for thread, count in sorted(self.threads.items(), key=lambda kv: -kv[1]):
            if thread == "bench-sampler":
                continue
            lines.append(f"\n== thread {thread} ({count} samples)")
            lines.append("-- innermost frame (share of this thread's samples)")
            mine = sorted(((n, k[1]) for k, n in self.leaf.items() if k[0] == thread), reverse=True)[:top]
            lines += [f"{n / count:6.1%}  {where}" for n, where in mine]
            lines.append("-- on the stack")
            mine = sorted(((n, k[1]) for k, n in self.inside.items() if k[0] == thread), reverse=True)[:top]
            lines += [f"{n / count:6.1%}  {where}" for n, where in mine]
        return "\n".join(lines)


def _short(filename: str) -> str:
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename.replace(str(ROOT) + "/", "")


def _write_stats(profile: object, path: Path, title: str) -> None:
    import io
    import pstats

    text = io.StringIO()
    text.write(f"{title}\n\n")
    stats = pstats.Stats(profile, stream=text).strip_dirs()  # type: ignore[arg-type]
    stats.sort_stats("tottime").print_stats(60)
    stats.sort_stats("cumulative").print_stats(100)
    path.write_text(text.getvalue())


def _databases() -> list[object]:
    """The node's open `Database` objects (bai/node/manager/state/sqlite/db.py), found among the live objects."""
    import gc

    return [o for o in gc.get_objects() if type(o).__name__ in ("Database", "PgDatabase") and hasattr(o, "_calls")]


def run_profiled(out_dir: Path, argv: list[str]) -> None:
    """Run `bai *argv` in this process; SIGUSR1 starts profiling, SIGUSR2 stops it and writes the reports to
    `out_dir`: cprofile.txt (the main thread, where the event loop runs), cprofile-db.txt (the database's
    thread; its profiler is switched on and off by calls queued to that thread), both by own time and by
    cumulative time, in CPU time of the thread (no waits for the GIL or for a core of a busy machine: those show
    in samples.txt, a wall-clock stack sampler of every thread)."""
    import cProfile
    import runpy
    import signal
    import time

    state: dict[str, object] = {}

    def start(signum: int, frame: object) -> None:
        if state:
            return
        profile = cProfile.Profile(time.thread_time)
        sampler = StackSampler(0.01)
        db_profile = cProfile.Profile(time.thread_time)
        state.update(profile=profile, sampler=sampler, db_profile=db_profile)
        for db in _databases()[:1]:
            db._calls.put((None, lambda conn: db_profile.enable(), ()))  # type: ignore[attr-defined]
        sampler.start()
        profile.enable()

    def stop(signum: int, frame: object) -> None:
        if not state:
            return
        profile, sampler, db_profile = state.pop("profile"), state.pop("sampler"), state.pop("db_profile")
        assert isinstance(profile, cProfile.Profile) and isinstance(sampler, StackSampler)
        assert isinstance(db_profile, cProfile.Profile)
        profile.disable()
        sampler.stop()
        out_dir.mkdir(parents=True, exist_ok=True)
        _write_stats(profile, out_dir / "cprofile.txt", "main thread (event loop), CPU time")
        (out_dir / "samples.txt").write_text(sampler.report())

        def db_done(conn: object) -> None:
            db_profile.disable()
            _write_stats(db_profile, out_dir / "cprofile-db.txt", "database thread, CPU time")
            (out_dir / "done").write_text("")

        for db in _databases()[:1]:
            db._calls.put((None, db_done, ()))  # type: ignore[attr-defined]

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["bai", *argv]
    sys.path.insert(0, str(ROOT))
    runpy.run_module("bai", run_name="__main__", alter_sys=True)


if __name__ == "__main__":  # python bench/benchnode.py --profile-to DIR -- node --role manager ...
    if len(sys.argv) < 4 or sys.argv[1] != "--profile-to" or sys.argv[3] != "--":
        raise SystemExit("usage: benchnode.py --profile-to DIR -- BAI-ARGS...")
    run_profiled(Path(sys.argv[2]), sys.argv[4:])
