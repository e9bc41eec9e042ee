"""Tests for bai/node/manager/services/vfolder_fs.py: file operations inside virtual folders.

Real files under tmp_path. The traversal tests plant symbolic links inside a folder pointing outside it
(as an untrusted kernel could) and check that nothing outside is read, created or removed."""

from __future__ import annotations

import os
import stat
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from bai.node.manager.services import vfolder_fs as fsops
from bai.node.manager.services.vfolder_fs import AlreadyExists, NotFound, PathRefused, Staging

TOKEN = "tok_0123456789abcdef"
IS_ROOT = os.geteuid() == 0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "folders" / "f1"
    fsops.make_folder(folder)
    return folder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the folder, with a secret file, a subdirectory and a big file."""
    out = tmp_path / "outside"
    (out / "sub").mkdir(parents=True)
    (out / "secret.txt").write_text("top secret")
    (out / "sub" / "keep.txt").write_text("keep me")
    (out / "big.bin").write_bytes(b"x" * 100_000)
    return out


@pytest.fixture
def planted(root: Path, outside: Path) -> Path:
    """Links a kernel could plant: to the outside directory, to the outside file, and inside a subfolder."""
    os.symlink(outside, root / "link_dir")
    os.symlink(outside / "secret.txt", root / "link_file")
    (root / "sub").mkdir()
    os.symlink(outside, root / "sub" / "deep_link")
    return root


def snapshot(path: Path) -> dict[str, tuple[str, int, bytes | None]]:
    """Every entry under path (links not followed): type, mode and file contents."""
    result: dict[str, tuple[str, int, bytes | None]] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            st = full.lstat()
            data = full.read_bytes() if stat.S_ISREG(st.st_mode) else None
            result[str(full.relative_to(path))] = (stat.filemode(st.st_mode), st.st_size, data)
    return result


# --- clean_relpath -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        ("a/b", ("a", "b")),
        ("./a//b", ("a", "b")),
        ("a/./b/", ("a", "b")),
        ("a\\b", ("a\\b",)),
        ("ünï cødé.txt", ("ünï cødé.txt",)),
        ("...", ("...",)),
    ],
)
def test_clean_relpath_accepts(path: str, parts: tuple[str, ...]) -> None:
    assert fsops.clean_relpath(path) == parts


@pytest.mark.parametrize(
    "path",
    ["/etc", "/", "../x", "a/../../b", "a/..", "..", "a\x00b", "a/" + "x" * 256, "a/" * 2100, "\udcff"],
)
def test_clean_relpath_refuses(path: str) -> None:
    with pytest.raises(PathRefused):
        fsops.clean_relpath(path)


def test_clean_relpath_root_only_when_allowed() -> None:
    for path in ("", ".", "./", ".//."):
        assert fsops.clean_relpath(path, allow_root=True) == ()
        with pytest.raises(PathRefused, match="not the folder itself"):
            fsops.clean_relpath(path)


def test_clean_relpath_limits_count_utf8_bytes() -> None:
    assert fsops.clean_relpath("é" * 127) == ("é" * 127,)  # 254 bytes
    with pytest.raises(PathRefused, match="255 bytes"):
        fsops.clean_relpath("é" * 128)  # 256 bytes


def test_refusal_messages_are_sentences() -> None:
    with pytest.raises(PathRefused, match="absolute path"):
        fsops.clean_relpath("/etc/passwd")
    with pytest.raises(PathRefused, match=r"'\.\.'"):
        fsops.clean_relpath("a/../../b")
    with pytest.raises(PathRefused, match="NUL"):
        fsops.clean_relpath("a\x00b")


# --- make_folder -------------------------------------------------------------------------------------


def test_make_folder_mode_and_exists(tmp_path: Path) -> None:
    folder = tmp_path / "host" / "deep" / "f"
    fsops.make_folder(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o2775
    with pytest.raises(AlreadyExists):
        fsops.make_folder(folder)


@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_make_folder_chowns(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    fsops.make_folder(folder, uid=1234, gid=2345)
    st = folder.stat()
    assert (st.st_uid, st.st_gid) == (1234, 2345)
    assert stat.S_IMODE(st.st_mode) == 0o2775


# --- listdir / stat ----------------------------------------------------------------------------------


def test_listdir_types_sizes_and_order(root: Path) -> None:
    (root / "b.txt").write_bytes(b"hello")
    os.chmod(root / "b.txt", 0o640)
    (root / "a_dir").mkdir()
    os.symlink("b.txt", root / "c_link")
    os.mkfifo(root / "d_fifo")
    entries = fsops.listdir(root)
    assert [e["name"] for e in entries] == ["a_dir", "b.txt", "c_link", "d_fifo"]
    by_name = {e["name"]: e for e in entries}
    assert by_name["a_dir"]["type"] == "dir"
    assert by_name["a_dir"]["size"] == 0
    assert by_name["b.txt"]["type"] == "file"
    assert by_name["b.txt"]["size"] == 5
    assert by_name["b.txt"]["mode"] == "0o640"
    assert by_name["c_link"]["type"] == "symlink"
    assert by_name["d_fifo"]["type"] == "other"
    modified = datetime.fromisoformat(by_name["b.txt"]["modified"])
    assert modified.utcoffset() is not None and modified.utcoffset().total_seconds() == 0
    assert abs(modified.timestamp() - (root / "b.txt").stat().st_mtime) < 1e-3


def test_listdir_subfolder_and_errors(root: Path) -> None:
    (root / "x" / "y").mkdir(parents=True)
    (root / "x" / "y" / "z.txt").write_text("z")
    assert [e["name"] for e in fsops.listdir(root, "x/y")] == ["z.txt"]
    assert fsops.listdir(root, "x/y/") == fsops.listdir(root, "./x//y")
    with pytest.raises(PathRefused, match="'x/y/z.txt' is not a folder"):
        fsops.listdir(root, "x/y/z.txt")
    with pytest.raises(NotFound, match="no such file or folder: 'x/nope' in this folder"):
        fsops.listdir(root, "x/nope/more")


def test_listdir_missing_root(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        fsops.listdir(tmp_path / "never-made")


def test_stat_entry_and_root(root: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / "f.bin").write_bytes(b"12345678")
    entry = fsops.stat(root, "d/f.bin")
    assert entry["name"] == "f.bin"
    assert entry["type"] == "file"
    assert entry["size"] == 8
    top = fsops.stat(root, "")
    assert top["name"] == ""
    assert top["type"] == "dir"
    assert top["mode"] == "0o2775"
    with pytest.raises(NotFound, match="'d/nope'"):
        fsops.stat(root, "d/nope")


# --- mkdir -------------------------------------------------------------------------------------------


def test_mkdir_plain_parents_exist_ok(root: Path) -> None:
    fsops.mkdir(root, "a")
    assert (root / "a").is_dir()
    with pytest.raises(NotFound, match="'b'"):
        fsops.mkdir(root, "b/c/d")
    assert not (root / "b").exists()
    fsops.mkdir(root, "b/c/d", parents=True)
    assert (root / "b" / "c" / "d").is_dir()
    with pytest.raises(AlreadyExists):
        fsops.mkdir(root, "a")
    fsops.mkdir(root, "a", exist_ok=True)
    fsops.mkdir(root, "b/c/d", parents=True, exist_ok=True)
    (root / "file").write_text("x")
    with pytest.raises(AlreadyExists):
        fsops.mkdir(root, "file", exist_ok=True)
    with pytest.raises(PathRefused, match="'file' is not a folder"):
        fsops.mkdir(root, "file/sub", parents=True)
    with pytest.raises(PathRefused):
        fsops.mkdir(root, "")


def test_mkdir_mode_ignores_umask(root: Path) -> None:
    old = os.umask(0o077)
    try:
        fsops.mkdir(root, "p/q", parents=True)
    finally:
        os.umask(old)
    # 0o775, plus the setgid bit inherited from the folder
    assert stat.S_IMODE((root / "p").stat().st_mode) == 0o2775
    assert stat.S_IMODE((root / "p" / "q").stat().st_mode) == 0o2775


@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_mkdir_chowns_created_directories_only(root: Path) -> None:
    (root / "existing").mkdir()
    fsops.mkdir(root, "existing/new/leaf", parents=True, uid=1234, gid=2345)
    for rel in ("existing/new", "existing/new/leaf"):
        st = (root / rel).stat()
        assert (st.st_uid, st.st_gid) == (1234, 2345), rel
    assert (root / "existing").stat().st_uid == 0


# --- rename ------------------------------------------------------------------------------------------


def test_rename_within_folder(root: Path) -> None:
    (root / "a.txt").write_text("A")
    (root / "dir").mkdir()
    fsops.rename(root, "a.txt", "dir/b.txt")
    assert not (root / "a.txt").exists()
    assert (root / "dir" / "b.txt").read_text() == "A"
    fsops.rename(root, "dir", "renamed")
    assert (root / "renamed" / "b.txt").read_text() == "A"


def test_rename_refuses_existing_destination(root: Path) -> None:
    (root / "a.txt").write_text("A")
    (root / "b.txt").write_text("B")
    with pytest.raises(AlreadyExists, match="'b.txt' already exists"):
        fsops.rename(root, "a.txt", "b.txt")
    assert (root / "a.txt").read_text() == "A"
    assert (root / "b.txt").read_text() == "B"
    (root / "empty").mkdir()
    with pytest.raises(AlreadyExists):
        fsops.rename(root, "a.txt", "empty")
    assert (root / "empty").is_dir()


def test_rename_errors(root: Path) -> None:
    (root / "d" / "e").mkdir(parents=True)
    with pytest.raises(NotFound, match="'nope'"):
        fsops.rename(root, "nope", "x")
    with pytest.raises(NotFound, match="'no'"):
        fsops.rename(root, "d", "no/x")
    with pytest.raises(PathRefused, match="into itself"):
        fsops.rename(root, "d", "d/e/f")
    with pytest.raises(PathRefused):
        fsops.rename(root, "", "x")
    with pytest.raises(PathRefused):
        fsops.rename(root, "d", "../escaped")
    assert (root / "d" / "e").is_dir()
    assert not (root.parent / "escaped").exists()


def test_rename_moves_a_link_itself(root: Path, outside: Path) -> None:
    os.symlink(outside / "secret.txt", root / "l")
    fsops.rename(root, "l", "l2")
    assert os.readlink(root / "l2") == str(outside / "secret.txt")
    assert (outside / "secret.txt").read_text() == "top secret"


# --- delete ------------------------------------------------------------------------------------------


def test_delete_file_and_empty_dir(root: Path) -> None:
    (root / "f.txt").write_text("x")
    (root / "empty").mkdir()
    assert fsops.delete(root, ["f.txt", "empty"]) == 2
    assert fsops.listdir(root) == []


def test_delete_non_empty_dir_needs_recursive(root: Path) -> None:
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "f.txt").write_text("x")
    (root / "d" / "g.txt").write_text("y")
    (root / "other.txt").write_text("z")
    with pytest.raises(PathRefused, match="'d' is a folder that is not empty; use recursive"):
        fsops.delete(root, ["other.txt", "d"])
    assert (root / "other.txt").exists()  # nothing removed: every path is checked first
    assert (root / "d" / "e" / "f.txt").exists()
    assert fsops.delete(root, ["d"], recursive=True) == 4
    assert not (root / "d").exists()
    assert (root / "other.txt").exists()


def test_delete_validates_all_paths_first(root: Path) -> None:
    (root / "a.txt").write_text("x")
    with pytest.raises(NotFound, match="'missing.txt'"):
        fsops.delete(root, ["a.txt", "missing.txt"])
    assert (root / "a.txt").exists()
    with pytest.raises(PathRefused):
        fsops.delete(root, ["a.txt", "../x"])
    assert (root / "a.txt").exists()


def test_delete_refuses_root(root: Path) -> None:
    (root / "a.txt").write_text("x")
    for path in ("", ".", "/"):
        with pytest.raises(PathRefused):
            fsops.delete(root, [path], recursive=True)
    assert root.is_dir() and (root / "a.txt").exists()


def test_delete_nested_paths_in_one_call(root: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / "f.txt").write_text("x")
    assert fsops.delete(root, ["d", "d/f.txt"], recursive=True) == 2
    assert not (root / "d").exists()


def test_delete_deep_tree(root: Path) -> None:
    path = root
    for i in range(300):
        path = path / f"l{i}"
    path.mkdir(parents=True)
    (path / "leaf.txt").write_text("x")
    assert fsops.delete(root, ["l0"], recursive=True) == 301
    assert fsops.listdir(root) == []


def test_delete_symlink_removes_only_the_link(planted: Path, outside: Path) -> None:
    before = snapshot(outside)
    assert fsops.delete(planted, ["link_file", "link_dir"]) == 2
    assert not os.path.lexists(planted / "link_file")
    assert not os.path.lexists(planted / "link_dir")
    assert snapshot(outside) == before


def test_delete_recursive_does_not_follow_links(planted: Path, outside: Path) -> None:
    before = snapshot(outside)
    # "sub" holds a link to the outside directory; "link_dir" itself is a link to it
    assert fsops.delete(planted, ["sub", "link_dir"], recursive=True) == 3
    assert not (planted / "sub").exists()
    assert snapshot(outside) == before


# --- traversal through planted links -----------------------------------------------------------------


@pytest.mark.parametrize("path", ["link_dir", "link_dir/sub", "sub/deep_link", "sub/deep_link/sub"])
def test_listdir_refuses_links(planted: Path, path: str) -> None:
    with pytest.raises(PathRefused, match="is a symbolic link; bai does not follow links inside a folder"):
        fsops.listdir(planted, path)


def test_stat_reports_link_but_never_goes_through(planted: Path) -> None:
    assert fsops.stat(planted, "link_dir")["type"] == "symlink"
    assert fsops.stat(planted, "link_file")["type"] == "symlink"
    with pytest.raises(PathRefused, match="'link_dir' is a symbolic link"):
        fsops.stat(planted, "link_dir/secret.txt")


@pytest.mark.parametrize("path", ["link_file", "link_dir/secret.txt", "sub/deep_link/secret.txt", "link_dir"])
def test_open_read_refuses_links(planted: Path, path: str) -> None:
    with pytest.raises(PathRefused, match="symbolic link"):
        fsops.open_read(planted, path)


def test_link_to_a_directory_inside_the_folder_is_refused_too(root: Path) -> None:
    (root / "real").mkdir()
    (root / "real" / "f.txt").write_text("x")
    os.symlink("real", root / "alias")
    with pytest.raises(PathRefused, match="'alias' is a symbolic link"):
        fsops.listdir(root, "alias")
    with pytest.raises(PathRefused, match="'alias' is a symbolic link"):
        fsops.open_read(root, "alias/f.txt")


def test_writes_through_links_are_refused(planted: Path, outside: Path, tmp_path: Path) -> None:
    (planted / "mine.txt").write_text("mine")
    before = snapshot(outside)
    attempts = [
        lambda: fsops.mkdir(planted, "link_dir/new"),
        lambda: fsops.mkdir(planted, "link_dir/new/deeper", parents=True),
        lambda: fsops.mkdir(planted, "sub/deep_link/new", parents=True),
        lambda: fsops.mkdir(planted, "link_dir", exist_ok=True),
        lambda: fsops.rename(planted, "link_dir/secret.txt", "stolen.txt"),
        lambda: fsops.rename(planted, "mine.txt", "link_dir/planted.txt"),
        lambda: fsops.rename(planted, "link_dir/sub", "stolen_dir"),
        lambda: fsops.delete(planted, ["link_dir/secret.txt"]),
        lambda: fsops.delete(planted, ["link_dir/sub"], recursive=True),
        lambda: fsops.delete(planted, ["sub/deep_link/secret.txt"], recursive=True),
    ]
    for attempt in attempts:
        with pytest.raises(PathRefused, match="symbolic link"):
            attempt()
    assert snapshot(outside) == before
    assert not (planted / "stolen.txt").exists()
    assert not (planted / "stolen_dir").exists()
    assert (planted / "mine.txt").read_text() == "mine"


def test_usage_does_not_follow_links(planted: Path) -> None:
    (planted / "sub" / "a.bin").write_bytes(b"a" * 10)
    (planted / "b.bin").write_bytes(b"b" * 5)
    os.symlink(planted.parent.parent / "outside" / "big.bin", planted / "big_link")
    # files: a.bin, b.bin, link_dir, link_file, deep_link, big_link; links count as 0 bytes
    assert fsops.usage(planted) == (15, 6)


# --- open_read ---------------------------------------------------------------------------------------


def test_open_read_regular_file(root: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / "data.bin").write_bytes(b"payload")
    fd, size = fsops.open_read(root, "d/data.bin")
    try:
        assert size == 7
        assert os.read(fd, 100) == b"payload"
        assert os.get_blocking(fd)
    finally:
        os.close(fd)


def test_open_read_refuses_directory_and_missing(root: Path) -> None:
    (root / "d").mkdir()
    with pytest.raises(PathRefused, match="'d' is a folder"):
        fsops.open_read(root, "d")
    with pytest.raises(NotFound, match="'d/none'"):
        fsops.open_read(root, "d/none")
    with pytest.raises(PathRefused):
        fsops.open_read(root, "")


def test_open_read_refuses_fifo_without_blocking(root: Path) -> None:
    fifo = root / "pipe"
    os.mkfifo(fifo)
    outcome: list[BaseException | tuple[int, int]] = []

    def attempt() -> None:
        try:
            outcome.append(fsops.open_read(root, "pipe"))
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(5)
    blocked = thread.is_alive()
    if blocked:  # release the reader stuck in open() so the thread ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    assert not blocked, "open_read blocked on a fifo"
    assert len(outcome) == 1 and isinstance(outcome[0], PathRefused)
    assert "not a regular file" in str(outcome[0])


def test_open_read_refuses_device(root: Path) -> None:
    try:
        os.mknod(root / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("cannot create device nodes here")
    with pytest.raises(PathRefused, match="not a regular file"):
        fsops.open_read(root, "null")


# --- usage -------------------------------------------------------------------------------------------


def test_usage_counts_bytes_and_files(root: Path) -> None:
    assert fsops.usage(root) == (0, 0)
    (root / "a").mkdir()
    (root / "a" / "b").mkdir()
    (root / "x.bin").write_bytes(b"1" * 100)
    (root / "a" / "y.bin").write_bytes(b"2" * 20)
    (root / "a" / "b" / "z.bin").write_bytes(b"3" * 3)
    os.mkfifo(root / "a" / "fifo")
    assert fsops.usage(root) == (123, 4)


def test_usage_survives_concurrent_changes(root: Path) -> None:
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            d = root / f"d{i % 5}"
            try:
                d.mkdir()
                for j in range(5):
                    (d / f"f{j}").write_bytes(b"x" * j)
                for j in range(5):
                    (d / f"f{j}").unlink()
                d.rmdir()
            except FileExistsError:
                pass
            i += 1

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 1.0
        runs = 0
        while time.monotonic() < deadline:
            size, files = fsops.usage(root)
            assert 0 <= files <= 25 and 0 <= size <= 50
            runs += 1
    finally:
        stop.set()
        thread.join(5)
    assert runs > 0


# --- Staging -----------------------------------------------------------------------------------------


@pytest.fixture
def staging(tmp_path: Path) -> Staging:
    return Staging(tmp_path / "folders" / ".staging")


def test_staging_dir_is_private(staging: Staging) -> None:
    assert stat.S_IMODE(staging.dir.stat().st_mode) == 0o700


@pytest.mark.parametrize("token", ["short", "x" * 129, "has space in it 1234", "../../etc/passwd1234", "a/b" * 8])
def test_staging_refuses_bad_tokens(staging: Staging, token: str) -> None:
    with pytest.raises(PathRefused):
        staging.create(token)
    assert os.listdir(staging.dir) == []


def test_staging_append_offsets(staging: Staging) -> None:
    staging.create(TOKEN)
    with pytest.raises(AlreadyExists):
        staging.create(TOKEN)
    assert staging.size(TOKEN) == 0
    assert staging.append(TOKEN, b"hello ", 0) == 6
    assert staging.append(TOKEN, b"world", 6) == 11
    with pytest.raises(ValueError, match="offset 3 does not match the 11 bytes received"):
        staging.append(TOKEN, b"XX", 3)
    with pytest.raises(ValueError, match="offset 20 does not match the 11 bytes received"):
        staging.append(TOKEN, b"XX", 20)
    assert staging.size(TOKEN) == 11
    assert (staging.dir / TOKEN).read_bytes() == b"hello world"


def test_staging_unknown_token(staging: Staging, root: Path) -> None:
    with pytest.raises(NotFound):
        staging.append(TOKEN, b"x", 0)
    with pytest.raises(NotFound):
        staging.size(TOKEN)
    with pytest.raises(NotFound):
        staging.commit(TOKEN, root, "x.txt")
    assert not (root / "x.txt").exists()


def test_staging_commit_appears_only_at_commit(staging: Staging, root: Path) -> None:
    staging.create(TOKEN)
    staging.append(TOKEN, b"part one, ", 0)
    dest = root / "new" / "deeper" / "upload.txt"
    assert not dest.exists() and not (root / "new").exists()
    staging.append(TOKEN, b"part two", 10)
    assert not dest.exists()
    staging.commit(TOKEN, root, "new/deeper/upload.txt")
    assert dest.read_bytes() == b"part one, part two"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o664
    assert not (staging.dir / TOKEN).exists()
    with pytest.raises(NotFound):
        staging.size(TOKEN)


def test_staging_commit_overwrite(staging: Staging, root: Path) -> None:
    (root / "f.txt").write_text("old")
    staging.create(TOKEN)
    staging.append(TOKEN, b"new", 0)
    with pytest.raises(AlreadyExists, match="'f.txt' already exists"):
        staging.commit(TOKEN, root, "f.txt", overwrite=False)
    assert (root / "f.txt").read_text() == "old"
    assert staging.size(TOKEN) == 3  # kept after a refusal
    staging.commit(TOKEN, root, "f.txt")
    assert (root / "f.txt").read_text() == "new"
    other = "other_0123456789abcdef"
    staging.create(other)
    staging.append(other, b"fresh", 0)
    staging.commit(other, root, "g.txt", overwrite=False)
    assert (root / "g.txt").read_text() == "fresh"
    assert not (staging.dir / other).exists()


def test_staging_commit_refuses_folder_destination(staging: Staging, root: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / "inner.txt").write_text("x")
    staging.create(TOKEN)
    with pytest.raises(PathRefused, match="'d' is a folder"):
        staging.commit(TOKEN, root, "d")
    assert (root / "d" / "inner.txt").read_text() == "x"
    with pytest.raises(PathRefused):
        staging.commit(TOKEN, root, "")
    assert staging.size(TOKEN) == 0


def test_staging_commit_through_links_refused(staging: Staging, planted: Path, outside: Path) -> None:
    before = snapshot(outside)
    staging.create(TOKEN)
    staging.append(TOKEN, b"evil", 0)
    for path in ("link_dir/secret.txt", "link_dir/new.txt", "link_dir/new/dir/x.txt", "sub/deep_link/a.txt"):
        with pytest.raises(PathRefused, match="'(link_dir|sub/deep_link)' is a symbolic link"):
            staging.commit(TOKEN, planted, path)
    with pytest.raises(PathRefused, match="'link_file' is a symbolic link"):
        staging.commit(TOKEN, planted, "link_file")
    assert snapshot(outside) == before
    assert os.readlink(planted / "link_file") == str(outside / "secret.txt")
    # refusals keep the staging file: the caller may retry elsewhere or discard it
    assert staging.size(TOKEN) == 4
    staging.commit(TOKEN, planted, "safe.txt")
    assert (planted / "safe.txt").read_bytes() == b"evil"


@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_staging_commit_chowns(staging: Staging, root: Path) -> None:
    staging.create(TOKEN)
    staging.commit(TOKEN, root, "made/f.txt", uid=1234, gid=2345)
    for rel in ("made", "made/f.txt"):
        st = (root / rel).stat()
        assert (st.st_uid, st.st_gid) == (1234, 2345), rel


def test_staging_discard(staging: Staging) -> None:
    staging.create(TOKEN)
    staging.discard(TOKEN)
    assert not (staging.dir / TOKEN).exists()
    staging.discard(TOKEN)  # already gone: fine
    with pytest.raises(PathRefused):
        staging.discard("../../something_long_enough")


def test_staging_sweep_by_age(staging: Staging) -> None:
    old, fresh = "old_0123456789abcdef", "new_0123456789abcdef"
    staging.create(old)
    staging.create(fresh)
    hour_ago = time.time() - 3600
    os.utime(staging.dir / old, (hour_ago, hour_ago))
    assert staging.sweep(600) == 1
    assert sorted(os.listdir(staging.dir)) == [fresh]
    assert staging.sweep(600) == 0
    assert staging.sweep(-1) == 1
    assert os.listdir(staging.dir) == []
