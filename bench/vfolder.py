"""Virtual-folder transfers through the bai HTTP API, against plain `cp` on the same disk measured in the same run.

Prints, for a node with the local backend whose state lies in the same temporary folder as the files:

1. one large file (default 1 GiB): the time and MiB/s of `cp` of it (the baseline), of its upload through
   the API (TUS-style PATCH in 16 MiB chunks) and of its download through the API, and the ratio API/cp
   for upload and for download (target: at least 0.5× of cp);
2. many small files (default 10,000 of 4 KiB): files/s and MiB/s of `cp -r` of their folder (the
   baseline), of uploading them all through the API and of downloading them all through the API (both
   with `--concurrency` transfers at a time), and the ratios API/cp.

The API transfers run once each; the cp baseline is the median of `--cp-runs` runs (cheap, and noisy on a
small VM), each of which is printed. Every run is warm-cache: the page cache cannot be dropped without
root, so each source is read once by an untimed `cp` before the timed runs. Dirty pages are written back
(`sync`) before each timed run, and no timed run waits for its own writes to reach the disk (cp neither).
Uploads are checked by the stored sizes, downloads by their SHA-256. Progress goes to stderr, figures to
stdout. Everything lies under one bai-bench-vfolder-* temporary folder (the node's state too, so the
same disk), removed at the end unless `--keep`.

    .venv/bin/python bench/vfolder.py [--size-mib 1024] [--files 10000] [--file-kib 4] [--concurrency 8]
        [--cp-runs 3] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchnode import BenchNode, start_node  # noqa: E402

if TYPE_CHECKING:
    from bai.client.api import Client

MIB = 1 << 20
BLOCK = 8 * MIB
CHUNK = 16 * MIB
TARGET = 0.5
FOLDER = "bench"


@dataclass
class Figures:
    times: dict[str, float]  # seconds: "cp" (the median of cp_runs), "upload", "download"
    cp_runs: list[float]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def client_for(node: BenchNode) -> Client:
    from bai.client.api import Client
    from bai.common.credentials import Credentials

    data = tomllib.loads((Path(node.env["XDG_CONFIG_HOME"]) / "bai" / "credentials.toml").read_text())
    return Client(Credentials(f"http://127.0.0.1:{node.port}", data["access_key"], data["secret_key"]))


def start_node_in(work: Path) -> BenchNode:
    """Start the node with its throw-away folder (and so its vfolders) under `work`, on the same disk."""
    saved = tempfile.tempdir
    tempfile.tempdir = str(work)
    try:
        return start_node("", "local")
    finally:
        tempfile.tempdir = saved


# -- sources -----------------------------------------------------------------------------------------


def write_random(path: Path, size: int) -> str:
    """Write `size` random bytes in 8 MiB blocks; return their SHA-256."""
    digest = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            block = os.urandom(min(BLOCK, left))
            digest.update(block)
            f.write(block)
            left -= len(block)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def write_small_files(folder: Path, count: int, size: int) -> dict[str, str]:
    """`count` random files of `size` bytes in `folder`; returns name → SHA-256."""
    folder.mkdir()
    hashes = {}
    for i in range(count):
        name = f"f{i:06d}.bin"
        data = os.urandom(size)
        (folder / name).write_bytes(data)
        hashes[name] = hashlib.sha256(data).hexdigest()
    return hashes


# -- timing ------------------------------------------------------------------------------------------


def cp(*args: str | Path) -> float:
    """Run `cp ARGS`; return its wall time in seconds."""
    settle()
    start = time.perf_counter()
    out = subprocess.run(["cp", *map(str, args)], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"cp {' '.join(map(str, args))} failed ({out.returncode}): {out.stderr}")
    return elapsed


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def warm_cp(*args: str | Path) -> None:
    """An untimed `cp` that reads the source into the page cache; its copy is removed."""
    cp(*args)
    remove(Path(args[-1]))


def baseline(runs: int, *args: str | Path) -> list[float]:
    """`runs` timed runs of `cp ARGS`, each into a fresh destination that is removed after it."""
    times = []
    for _ in range(runs):
        times.append(cp(*args))
        remove(Path(args[-1]))
    return times


def settle() -> None:
    """Write back what earlier steps left dirty (no root needed), so it does not slow the next timed run."""
    os.sync()


async def timed(work: Awaitable[object]) -> float:
    settle()
    start = time.perf_counter()
    await work
    return time.perf_counter() - start


async def bounded(count: int, concurrency: int, one: Callable[[int], Awaitable[object]]) -> None:
    """Run one(0) … one(count - 1), at most `concurrency` at a time."""
    index = 0

    async def worker() -> None:
        nonlocal index
        while index < count:
            i, index = index, index + 1
            await one(i)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))


# -- the two scenarios -------------------------------------------------------------------------------


async def large_file(client: Client, work: Path, stored_root: Path, size: int, cp_runs: int) -> Figures:
    src = work / "src" / "large.bin"
    log(f"writing {size // MIB} MiB of random data to {src}")
    digest = write_random(src, size)
    warm_cp(src, work / "warm-large.bin")

    log(f"cp (baseline), {cp_runs} runs")
    cp_times = baseline(cp_runs, src, work / "cp-large.bin")
    times = {"cp": statistics.median(cp_times)}

    log(f"API upload in {CHUNK // MIB} MiB chunks")
    times["upload"] = await timed(client.upload_file(FOLDER, src, "large.bin", chunk=CHUNK))
    stored = stored_root / "large.bin"
    if stored.stat().st_size != size:
        raise SystemExit(f"the stored {stored} holds {stored.stat().st_size} bytes, not {size}")

    log("API download")
    dest = work / "dl" / "large.bin"
    times["download"] = await timed(client.download_file(FOLDER, "large.bin", dest))
    if sha256_of(dest) != digest:
        raise SystemExit(f"the downloaded {dest} differs from the source")
    dest.unlink()
    return Figures(times, cp_times)


async def small_files(
    client: Client, work: Path, stored_root: Path, count: int, size: int, concurrency: int, cp_runs: int
) -> Figures:
    src = work / "src" / "small"
    log(f"writing {count} random files of {size} bytes to {src}")
    hashes = write_small_files(src, count, size)
    names = sorted(hashes)
    warm_cp("-r", src, work / "warm-small")

    log(f"cp -r (baseline), {cp_runs} runs")
    cp_times = baseline(cp_runs, "-r", src, work / "cp-small")
    times = {"cp": statistics.median(cp_times)}

    await client.vfolder_action(FOLDER, "mkdir", path="small", parents=True, exist_ok=True)
    log(f"API upload of {count} files, {concurrency} at a time")

    async def upload(i: int) -> None:
        await client.upload_file(FOLDER, src / names[i], f"small/{names[i]}", chunk=CHUNK)

    times["upload"] = await timed(bounded(count, concurrency, upload))
    stored = {p.name: p.stat().st_size for p in (stored_root / "small").iterdir()}
    if stored != dict.fromkeys(names, size):
        raise SystemExit(f"the stored folder holds {len(stored)} files, not the {count} of {size} bytes uploaded")

    log(f"API download of {count} files, {concurrency} at a time")
    dest = work / "dl" / "small"
    dest.mkdir()

    async def download(i: int) -> None:
        await client.download_file(FOLDER, f"small/{names[i]}", dest / names[i])

    times["download"] = await timed(bounded(count, concurrency, download))
    for name in names:
        if hashlib.sha256((dest / name).read_bytes()).hexdigest() != hashes[name]:
            raise SystemExit(f"the downloaded {dest / name} differs from the source")
    shutil.rmtree(dest)
    return Figures(times, cp_times)


# -- output ------------------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    return f"median of {len(values)}: " + ", ".join(f"{v:.2f}" for v in values) + " s"


def report_large(fig: Figures, size: int) -> None:
    mib = size / MIB
    times = fig.times
    print(f"\none large file: {mib:.0f} MiB (API upload in {CHUNK // MIB} MiB PATCH chunks)")
    for key, label in (("cp", "cp (baseline)"), ("upload", "API upload"), ("download", "API download")):
        line = f"  {label:<17} {times[key]:8.2f} s  {mib / times[key]:9.1f} MiB/s"
        if key == "cp":
            line += f"   ({spread(fig.cp_runs)})"
        else:
            r = times["cp"] / times[key]
            line += f"   {r:.2f}× cp  (target ≥ {TARGET}× cp: {'met' if r >= TARGET else 'MISSED'})"
        print(line)


def report_small(fig: Figures, count: int, size: int, concurrency: int) -> None:
    mib = count * size / MIB
    times = fig.times
    print(
        f"\nmany small files: {count} × {size // 1024} KiB = {mib:.1f} MiB"
        f" (API: {concurrency} transfers at a time, each with its own request-upload/-download grant)"
    )
    for key, label in (("cp", "cp -r (baseline)"), ("upload", "API upload"), ("download", "API download")):
        line = f"  {label:<17} {times[key]:8.2f} s  {count / times[key]:9.0f} files/s  {mib / times[key]:8.1f} MiB/s"
        line += f"   ({spread(fig.cp_runs)})" if key == "cp" else f"   {times['cp'] / times[key]:.2f}× cp"
        print(line)


# -- main --------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, work: Path, node: BenchNode) -> None:
    loop = asyncio.get_running_loop()
    # every API call runs in a worker thread: make room for `concurrency` transfers at a time
    loop.set_default_executor(ThreadPoolExecutor(max_workers=args.concurrency + 4))
    async with client_for(node) as client:
        await client.create_vfolder(FOLDER)
        folder_id = (await client.vfolder(FOLDER))["id"]
        stored_root = node.folder / "state" / "vfolders" / folder_id
        if not stored_root.is_dir():
            raise SystemExit(f"the folder {FOLDER!r} is not stored at {stored_root}")
        large = await large_file(client, work, stored_root, args.size_mib * MIB, args.cp_runs)
        small = await small_files(
            client, work, stored_root, args.files, args.file_kib * 1024, args.concurrency, args.cp_runs
        )

    print(f"virtual-folder transfers: bai API (local node, 127.0.0.1) against cp, same disk ({work})")
    print("all runs warm-cache (the page cache cannot be dropped without root; each source was read once before)")
    print("sync before each timed run; no run waits for its own writes to reach the disk (cp neither)")
    print(
        f"API: one run each; cp: median of {args.cp_runs} runs; the client, the node and cp share"
        f" this machine's {os.cpu_count()} CPUs"
    )
    report_large(large, args.size_mib * MIB)
    report_small(small, args.files, args.file_kib * 1024, args.concurrency)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024, help="size of the large file")
    ap.add_argument("--files", type=int, default=10000, help="how many small files")
    ap.add_argument("--file-kib", type=int, default=4, help="size of each small file")
    ap.add_argument("--concurrency", type=int, default=8, help="API transfers at a time for the small files")
    ap.add_argument("--cp-runs", type=int, default=3, help="timed cp runs; the baseline is their median")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    if min(args.size_mib, args.files, args.file_kib, args.concurrency, args.cp_runs) < 1:
        ap.error("every size and count must be at least 1")

    work = Path(tempfile.mkdtemp(prefix="bai-bench-vfolder-"))
    for sub in ("src", "dl"):
        (work / sub).mkdir()
    node = None
    try:
        log(f"starting a node under {work}")
        node = start_node_in(work)
        asyncio.run(run(args, work, node))
    finally:
        if node is not None:
            node.stop()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
