"""The shiv zipapp: built from shiv.toml, run from another folder with its own SHIV_ROOT, a node and a
session from it, and old extractions cleaned up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import ROOT, free_port

pytestmark = pytest.mark.xdist_group("zipapp")  # one worker: the zipapp is built once (about 20 s)


@pytest.fixture(scope="module")
def pyz(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("zipapp") / "bai.pyz"
    result = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "build-zipapp.py"), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # (19 MB: psycopg's binary wheel, the PostgreSQL driver, carries its own libpq, about 4 MB)
    assert out.stat().st_size < 19 * 1024 * 1024, "the zipapp should stay under 19 MB"
    return out


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """Nothing of this checkout: another folder, its own SHIV_ROOT, config and data homes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BACKEND_", "BAI_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if ".venv" not in p)
    env.update(
        SHIV_ROOT=str(tmp_path / "shiv"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        XDG_DATA_HOME=str(tmp_path / "data"),
        HOME=str(tmp_path / "home"),
    )
    (tmp_path / "home").mkdir()
    return env


def run(
    pyz: Path, env: dict[str, str], cwd: Path, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(pyz), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_the_zipapp_runs_from_anywhere_and_keeps_one_extraction(pyz: Path, clean_env: dict, tmp_path: Path) -> None:
    shiv_root = Path(clean_env["SHIV_ROOT"])
    old = shiv_root / f"{pyz.name}_0123456789abcdef" / "site-packages"
    old.mkdir(parents=True)
    (shiv_root / f".{pyz.name}_0123456789abcdef_lock").touch()
    other_app = shiv_root / "other.pyz_0123456789abcdef" / "site-packages"  # not ours: left alone
    other_app.mkdir(parents=True)
    result = run(pyz, clean_env, tmp_path, "--version")
    assert result.returncode == 0 and result.stdout.startswith("bai "), result.stderr
    ours = sorted(p.name for p in shiv_root.glob(f"{pyz.name}_*"))
    assert len(ours) == 1 and not ours[0].endswith("0123456789abcdef"), ours
    assert not (shiv_root / f".{pyz.name}_0123456789abcdef_lock").exists()
    assert other_app.is_dir()


@pytest.fixture
def pyz_node(pyz: Path, clean_env: dict, tmp_path: Path) -> Iterator[tuple[Path, dict, Path]]:
    work = tmp_path / "work"
    work.mkdir()
    node_log = tmp_path / "node.log"
    for _attempt in range(3):  # a free port can be taken by another test before the node binds it
        port = free_port()
        with node_log.open("w") as log:
            proc = subprocess.Popen(
                [str(pyz), "node", "--backend", "local", "--listen", f"127.0.0.1:{port}"],
                env=clean_env,
                cwd=work,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        # the banner's own line: "already in use" holds the word too
        while not any(line.startswith("ready;") for line in node_log.read_text().splitlines()):
            if proc.poll() is not None:
                break
            assert time.monotonic() < deadline, node_log.read_text()
            time.sleep(0.2)
        if proc.poll() is None:
            break
        assert "already in use" in node_log.read_text(), node_log.read_text()
    else:
        pytest.fail("no free port for the node in three tries")
    yield pyz, clean_env, work
    proc.terminate()
    proc.wait(30)


def test_a_node_and_a_session_from_the_zipapp(pyz_node) -> None:
    pyz, env, work = pyz_node
    result = run(pyz, env, work, "session", "run", "python", "-c", "print('from the zipapp', 6 * 7)")
    assert result.returncode == 0 and "from the zipapp 42" in result.stdout, result.stderr
    listed = run(pyz, env, work, "agent", "ls")
    assert listed.returncode == 0 and "local" in listed.stdout


def test_the_zipapp_carries_the_declared_dependencies(pyz: Path, clean_env: dict, tmp_path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(pyz) as z:
        tops = {name.split("/")[1] for name in z.namelist() if name.startswith("site-packages/")}
    assert {"aiohttp", "tomli_w", "aiodocker", "msgspec"} <= tops, sorted(tops)
    assert "tomli" not in tops  # Python 3.11 reads TOML with the standard library
    result = run(pyz, clean_env, tmp_path, "config", "show")  # written with tomli-w
    assert result.returncode == 0 and 'role = "all"' in result.stdout, result.stderr


def test_after_the_first_run_the_zipapp_starts_without_shivs_bootstrap(
    pyz: Path, clean_env: dict, tmp_path: Path
) -> None:
    """The first run unpacks through shiv's bootstrap; later ones take the lean start (packaging/build-zipapp.py),
    with the same sys.path: what `python -X importtime` shows of each; any other SHIV_* variable: shiv's way."""

    def started(extra: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
        cmd = [sys.executable, "-X", "importtime", str(pyz), "--version"]
        out = subprocess.run(cmd, env=clean_env | extra, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.startswith("bai "), out.stderr[-2000:]
        return out, {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.count("|") == 2}

    clean_env = clean_env | {"SHIV_ROOT": str(tmp_path / "lean-shiv")}
    first, first_modules = started({})
    assert "_bootstrap" in first_modules  # (it unpacked)
    again, modules = started({})
    assert "_bootstrap" not in modules and "compileall" not in modules and "bai.cli.main" in modules
    assert again.stdout == first.stdout
    forced, forced_modules = started({"SHIV_ENTRY_POINT": "bai.cli.main:main"})
    assert "_bootstrap" in forced_modules and forced.stdout == first.stdout
    # the same sys.path as shiv's bootstrap makes: the zipapp run in-process, sys.exit showing the path instead
    probe = (
        "import runpy, sys; sys.argv = [PYZ, '--version']; sys.path.insert(0, PYZ); "
        "sys.exit = lambda *a: print('PATH', [p for p in sys.path if 'site-packages' in p]); "
        "runpy.run_path(PYZ, run_name='__main__')"
    ).replace("PYZ", repr(str(pyz)))
    paths = []
    for extra in ({}, {"SHIV_ENTRY_POINT": "bai.cli.main:main"}):  # lean, then shiv's
        out = subprocess.run(
            [sys.executable, "-c", probe], env=clean_env | extra, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr[-2000:]
        paths += [line for line in out.stdout.splitlines() if line.startswith("PATH ")]
    assert len(paths) == 2 and paths[0] == paths[1] and "lean-shiv" in paths[0].split(",")[0], paths
