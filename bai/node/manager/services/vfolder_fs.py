"""File operations inside virtual folders, safe against links and races planted by kernels.

Kernels mount folders read-write, so anything inside a folder may be a symbolic link, a fifo or a device
node, and may be swapped for one at any moment. Every operation here therefore opens paths one component
at a time from a directory file descriptor, with O_NOFOLLOW, and acts on the last component relative to
its parent's descriptor: a link is never followed, so nothing outside the folder is ever touched.

All functions are synchronous and blocking; callers run them in a thread.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat as _stat
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096
DIR_MODE = 0o775
FOLDER_MODE = 0o2775
FILE_MODE = 0o664

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,128}")
_LINK_REFUSAL = "{} is a symbolic link; bai does not follow links inside a folder"


class PathRefused(ValueError):
    """A path a user may not use (absolute, .., NUL, symlink, outside the folder, wrong type).

    str() is a sentence for the user."""


class NotFound(FileNotFoundError):
    """str() is a sentence: "no such file or folder: 'x/y' in this folder"."""


class AlreadyExists(FileExistsError):
    """The destination of a create, rename or commit already exists; str() is a sentence."""


def clean_relpath(path: str, *, allow_root: bool = False) -> tuple[str, ...]:
    """Split a user path into components, refusing anything that could leave the folder.

    '' / '.' / './' mean the folder itself, accepted only with allow_root; '.' and empty components
    are skipped; backslashes are ordinary characters."""
    if not isinstance(path, str):
        raise PathRefused("a path must be a string")
    if "\x00" in path:
        raise PathRefused("a path may not contain NUL characters")
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        raise PathRefused("a path must be valid UTF-8") from None
    if size > MAX_PATH_BYTES:
        raise PathRefused(f"a path may be at most {MAX_PATH_BYTES} bytes long")
    if path.startswith("/"):
        raise PathRefused(f"{path!r} is an absolute path; give a path relative to the folder")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            raise PathRefused(f"{path!r} contains '..'; paths may not leave the folder")
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise PathRefused(f"a file or folder name may be at most {MAX_COMPONENT_BYTES} bytes long")
        parts.append(part)
    if not parts and not allow_root:
        raise PathRefused("give a path to a file or folder inside this folder, not the folder itself")
    return tuple(parts)


# --- helpers ----------------------------------------------------------------------------------------


def _shown(parts: tuple[str, ...] | list[str]) -> str:
    return repr("/".join(parts))


def _not_found(parts: tuple[str, ...] | list[str]) -> NotFound:
    return NotFound(f"no such file or folder: {_shown(parts)} in this folder")


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _refusal(dir_fd: int, name: str, parts: tuple[str, ...]) -> PathRefused | NotFound:
    """Why `name` (shown as `parts`) could not be opened as a directory."""
    st = _lstat(dir_fd, name)
    if st is None:
        return _not_found(parts)
    if _stat.S_ISLNK(st.st_mode):
        return PathRefused(_LINK_REFUSAL.format(_shown(parts)))
    return PathRefused(f"{_shown(parts)} is not a folder")


def _chown(fd: int, uid: int | None, gid: int | None) -> None:
    """fchown when asked; a process that is not root skips the owners it may not set."""
    if uid is None and gid is None:
        return
    try:
        os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
    except PermissionError:
        if os.geteuid() == 0:
            raise


def _own_dir(fd: int, uid: int | None, gid: int | None) -> None:
    """Owner and mode of a directory bai created (keeps a setgid bit inherited from the parent)."""
    _chown(fd, uid, gid)
    os.fchmod(fd, DIR_MODE | (os.fstat(fd).st_mode & _stat.S_ISGID))


def _open_root(root: Path) -> int:
    try:
        return os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        raise NotFound("this folder's directory does not exist on this host") from None
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            raise PathRefused("this folder's directory is not a directory on this host") from None
        raise


def _open_dir(
    root: Path, parts: tuple[str, ...], *, create: bool = False, uid: int | None = None, gid: int | None = None
) -> int:
    """A new descriptor for the directory root/parts, opened a component at a time without following links.

    With create, missing directories are made (mode 0o775, owned by uid/gid). The caller closes it."""
    fd = _open_root(root)
    try:
        for i, name in enumerate(parts):
            shown = parts[: i + 1]
            created = False
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise _not_found(shown) from None
                try:
                    os.mkdir(name, DIR_MODE, dir_fd=fd)
                    created = True
                except FileExistsError:
                    pass  # made concurrently: open it below like any other
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        raise _refusal(fd, name, shown) from None
                    raise
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise _refusal(fd, name, shown) from None
                raise
            os.close(fd)
            fd = child
            if created:
                _own_dir(fd, uid, gid)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _type_of(mode: int) -> str:
    if _stat.S_ISREG(mode):
        return "file"
    if _stat.S_ISDIR(mode):
        return "dir"
    if _stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _entry(name: str, st: os.stat_result) -> dict[str, Any]:
    kind = _type_of(st.st_mode)
    return {
        "name": name,
        "type": kind,
        "size": 0 if kind == "dir" else st.st_size,
        "mode": oct(st.st_mode & 0o7777),
        "modified": datetime.fromtimestamp(st.st_mtime, tz=UTC).isoformat(),
    }


# --- operations -------------------------------------------------------------------------------------


def make_folder(root: Path, uid: int | None = None, gid: int | None = None) -> None:
    """Create a folder's directory (mode 0o2775, parents made as needed), owned by uid/gid when given."""
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        raise AlreadyExists(f"the folder's directory {str(root)!r} already exists") from None
    fd = os.open(root, _DIR_FLAGS)
    try:
        _chown(fd, uid, gid)
        os.fchmod(fd, FOLDER_MODE)
    finally:
        os.close(fd)


def listdir(root: Path, path: str = "") -> list[dict[str, Any]]:
    """The entries of a directory in the folder, sorted by name; links are reported, never followed."""
    parts = clean_relpath(path, allow_root=True)
    fd = _open_dir(root, parts)
    try:
        entries = []
        for name in os.listdir(fd):
            st = _lstat(fd, name)
            if st is not None:  # removed since it was listed
                entries.append(_entry(name, st))
    finally:
        os.close(fd)
    return sorted(entries, key=lambda e: e["name"])


def stat(root: Path, path: str) -> dict[str, Any]:
    """One entry, like listdir's; "" is the folder itself (name ""). A link is reported, not followed."""
    parts = clean_relpath(path, allow_root=True)
    if not parts:
        fd = _open_root(root)
        try:
            return _entry("", os.fstat(fd))
        finally:
            os.close(fd)
    fd = _open_dir(root, parts[:-1])
    try:
        st = _lstat(fd, parts[-1])
    finally:
        os.close(fd)
    if st is None:
        raise _not_found(parts)
    return _entry(parts[-1], st)


def mkdir(
    root: Path,
    path: str,
    *,
    parents: bool = False,
    exist_ok: bool = False,
    uid: int | None = None,
    gid: int | None = None,
) -> None:
    """Create a directory (mode 0o775, owned by uid/gid when given); parents makes the missing ones too."""
    parts = clean_relpath(path)
    fd = _open_dir(root, parts[:-1], create=parents, uid=uid, gid=gid)
    try:
        leaf = parts[-1]
        try:
            os.mkdir(leaf, DIR_MODE, dir_fd=fd)
        except FileExistsError:
            st = _lstat(fd, leaf)
            if st is not None and _stat.S_ISLNK(st.st_mode):
                raise PathRefused(_LINK_REFUSAL.format(_shown(parts))) from None
            if exist_ok and st is not None and _stat.S_ISDIR(st.st_mode):
                return
            raise AlreadyExists(f"{_shown(parts)} already exists") from None
        try:
            child = os.open(leaf, _DIR_FLAGS, dir_fd=fd)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise _refusal(fd, leaf, parts) from None
            raise
        try:
            _own_dir(child, uid, gid)
        finally:
            os.close(child)
    finally:
        os.close(fd)


def rename(root: Path, src: str, dst: str) -> None:
    """Move src to dst inside the same folder; dst must not exist and its parent must.

    A link at src is moved itself (links are never followed)."""
    src_parts = clean_relpath(src)
    dst_parts = clean_relpath(dst)
    if len(dst_parts) > len(src_parts) and dst_parts[: len(src_parts)] == src_parts:
        raise PathRefused(f"cannot move {_shown(src_parts)} into itself")
    _rename_at(root, src_parts, dst_parts, replace_file=False)


def _rename_at(root: Path, src_parts: tuple[str, ...], dst_parts: tuple[str, ...], replace_file: bool) -> None:
    """os.rename between two folders opened without following links; what is at dst stops it (but a file
    replaced by a file when `replace_file`)."""
    src_fd = _open_dir(root, src_parts[:-1])
    try:
        dst_fd = _open_dir(root, dst_parts[:-1])
        try:
            st = _lstat(src_fd, src_parts[-1])
            if st is None:
                raise _not_found(src_parts)
            there = _lstat(dst_fd, dst_parts[-1])
            if there is not None:
                file_by_file = _stat.S_ISREG(there.st_mode) and not _stat.S_ISDIR(st.st_mode)
                if not (replace_file and file_by_file):
                    only = " (only a file is replaced, by a file)" if replace_file else ""
                    raise AlreadyExists(f"{_shown(dst_parts)} already exists{only}")
            try:
                os.rename(src_parts[-1], dst_parts[-1], src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except FileNotFoundError:
                raise _not_found(src_parts) from None
            except OSError as e:
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                    raise AlreadyExists(f"{_shown(dst_parts)} already exists") from None
                if e.errno == errno.EINVAL:
                    raise PathRefused(f"cannot move {_shown(src_parts)} into itself") from None
                raise
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def move(root: Path, src: str, dst: str) -> str:
    """Backend.AI's move-file: src goes to dst, or into dst when dst is a folder; a file in the way is
    replaced (a folder or link in the way is not). Returns where it went. Links are never followed."""
    src_parts = clean_relpath(src)
    dst_parts = clean_relpath(dst, allow_root=True)
    fd = _open_dir(root, dst_parts) if not dst_parts else None
    if fd is None:
        parent = _open_dir(root, dst_parts[:-1])
        try:
            st = _lstat(parent, dst_parts[-1])
        finally:
            os.close(parent)
        if st is not None and _stat.S_ISDIR(st.st_mode):
            dst_parts = (*dst_parts, src_parts[-1])
    else:
        os.close(fd)  # the folder itself: into it
        dst_parts = (src_parts[-1],)
    if dst_parts == src_parts:
        return "/".join(dst_parts)
    if len(dst_parts) > len(src_parts) and dst_parts[: len(src_parts)] == src_parts:
        raise PathRefused(f"cannot move {_shown(src_parts)} into itself")
    _rename_at(root, src_parts, dst_parts, replace_file=True)
    return "/".join(dst_parts)


def _open_regular(dir_fd: int, name: str) -> int | None:
    """A regular file in dir_fd opened for reading (never a link, fifo or device); None for anything else."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO, errno.EACCES, errno.EPERM):
            return None
        raise
    if not _stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return fd


def _walk(root: Path, base: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], int, str, os.stat_result]]:
    """(parts relative to base, dir fd, name, lstat) of everything under root/base, each directory
    before what it holds and the entries of one directory together; links are never followed. A dir
    fd is valid until the next item; one directory is open at a time (no limit on width or depth)."""
    stack: list[tuple[str, ...]] = [()]
    while stack:
        parts = stack.pop()
        try:
            fd = _open_dir(root, base + parts)
        except (NotFound, PathRefused):
            if not parts:
                raise
            continue  # removed, or swapped for a link, since it was listed
        try:
            subdirs = []
            for name in sorted(os.listdir(fd)):
                st = _lstat(fd, name)
                if st is None:
                    continue
                yield (*parts, name), fd, name, st
                if _stat.S_ISDIR(st.st_mode):
                    subdirs.append((*parts, name))
            stack.extend(reversed(subdirs))
        finally:
            os.close(fd)


def copy_tree(src_root: Path, dst_root: Path, uid: int | None = None, gid: int | None = None) -> int:
    """Copy a folder's files and directories (links as links, never followed; fifos and devices are left
    out) into another folder's empty directory; returns the bytes copied."""
    copied = 0
    parent_parts: tuple[str, ...] | None = None
    parent = -1
    try:
        for parts, fd, name, st in _walk(src_root):
            if parts[:-1] != parent_parts:
                if parent >= 0:
                    os.close(parent)
                    parent = -1
                parent = _open_dir(dst_root, parts[:-1])
                parent_parts = parts[:-1]
            if _stat.S_ISDIR(st.st_mode):
                os.mkdir(name, DIR_MODE, dir_fd=parent)
                child = os.open(name, _DIR_FLAGS, dir_fd=parent)
                try:
                    _own_dir(child, uid, gid)
                finally:
                    os.close(child)
            elif _stat.S_ISLNK(st.st_mode):
                try:
                    os.symlink(os.readlink(name, dir_fd=fd), name, dir_fd=parent)
                except FileNotFoundError:
                    pass
            elif _stat.S_ISREG(st.st_mode):
                rfd = _open_regular(fd, name)
                if rfd is None:
                    continue
                try:
                    wfd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                  FILE_MODE, dir_fd=parent)  # fmt: skip
                    try:
                        while n := os.sendfile(wfd, rfd, None, 16 << 20):
                            copied += n
                        _chown(wfd, uid, gid)
                        os.fchmod(wfd, FILE_MODE)
                    finally:
                        os.close(wfd)
                finally:
                    os.close(rfd)
    finally:
        if parent >= 0:
            os.close(parent)
    return copied


def zip_dir(root: Path, path: str, out: Any) -> None:
    """Write a zip of a directory in the folder ("" is the whole folder) to the binary file `out`:
    its files and directories; links, fifos and devices are left out (and never followed)."""
    import zipfile

    base = clean_relpath(path, allow_root=True)
    os.close(_open_dir(root, base))  # (a missing folder is refused before anything is written)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1, allowZip64=True) as zf:
        for parts, fd, name, st in _walk(root, base):
            stamp = time.gmtime(max(st.st_mtime, 315532800))[:6]  # (zip dates start in 1980)
            if _stat.S_ISDIR(st.st_mode):
                info = zipfile.ZipInfo("/".join(parts) + "/", stamp)
                info.external_attr = ((_stat.S_IFDIR | (st.st_mode & 0o7777)) << 16) | 0x10
                zf.writestr(info, b"")
            elif _stat.S_ISREG(st.st_mode):
                rfd = _open_regular(fd, name)
                if rfd is None:
                    continue
                info = zipfile.ZipInfo("/".join(parts), stamp)
                info.external_attr = (_stat.S_IFREG | (st.st_mode & 0o7777)) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                with os.fdopen(rfd, "rb") as src, zf.open(info, "w", force_zip64=True) as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)


def _remove_tree(parent_fd: int, name: str) -> int:
    """Remove parent/name and, if it is a directory, everything in it; returns entries removed.

    Iterative (no recursion limit); holds one descriptor per level of depth; never follows links."""
    removed = 0
    # each frame: (parent fd, name in parent, directory fd, names still to remove, relists left)
    stack: list[tuple[int, str, int, list[str], int]] = []

    def enter(pfd: int, child: str) -> None:
        nonlocal removed
        for _ in range(10):
            try:
                os.unlink(child, dir_fd=pfd)
                removed += 1
                return
            except FileNotFoundError:
                return
            except (IsADirectoryError, PermissionError) as e:
                # Linux: EISDIR; some systems: EPERM for a directory
                st = _lstat(pfd, child)
                if st is None:
                    return
                if not _stat.S_ISDIR(st.st_mode):
                    if isinstance(e, PermissionError):
                        raise
                    continue
            try:
                fd = os.open(child, _DIR_FLAGS, dir_fd=pfd)
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):
                    continue  # swapped for a file or link since: unlink that instead
                raise
            try:
                names = os.listdir(fd)
            except BaseException:
                os.close(fd)
                raise
            stack.append((pfd, child, fd, names, 3))
            return
        raise PathRefused(f"{child!r} kept changing while it was being deleted; try again")

    enter(parent_fd, name)
    try:
        while stack:
            pfd, dname, fd, names, relists = stack[-1]
            if names:
                enter(fd, names.pop())
                continue
            try:
                os.rmdir(dname, dir_fd=pfd)
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST) and relists > 0:
                    stack[-1] = (pfd, dname, fd, os.listdir(fd), relists - 1)  # filled concurrently
                    continue
                raise
            stack.pop()
            os.close(fd)
    finally:
        for _, _, fd, _, _ in stack:
            os.close(fd)
    return removed


def delete(root: Path, paths: list[str], *, recursive: bool = False) -> int:
    """Remove files, links (never their targets) and, with recursive, directories; returns entries removed.

    Every path is checked before anything is removed; a path already gone by the time its turn comes
    (say, inside a directory removed earlier in the list) is skipped."""
    checked = [clean_relpath(p) for p in paths]
    for parts in checked:
        fd = _open_dir(root, parts[:-1])
        try:
            st = _lstat(fd, parts[-1])
            if st is None:
                raise _not_found(parts)
            if _stat.S_ISDIR(st.st_mode) and not recursive:
                try:
                    child = os.open(parts[-1], _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        raise _refusal(fd, parts[-1], parts) from None
                    raise
                try:
                    if os.listdir(child):
                        raise PathRefused(f"{_shown(parts)} is a folder that is not empty; use recursive")
                finally:
                    os.close(child)
        finally:
            os.close(fd)
    removed = 0
    for parts in checked:
        try:
            fd = _open_dir(root, parts[:-1])
        except NotFound:
            continue
        try:
            if recursive:
                removed += _remove_tree(fd, parts[-1])
                continue
            st = _lstat(fd, parts[-1])
            if st is None:
                continue
            try:
                if _stat.S_ISDIR(st.st_mode):
                    os.rmdir(parts[-1], dir_fd=fd)
                else:
                    os.unlink(parts[-1], dir_fd=fd)
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise PathRefused(f"{_shown(parts)} is a folder that is not empty; use recursive") from None
                if e.errno in (errno.EISDIR, errno.ENOTDIR):
                    raise PathRefused(f"{_shown(parts)} changed while it was being deleted; try again") from None
                raise
        finally:
            os.close(fd)
    return removed


def open_read(root: Path, path: str) -> tuple[int, int]:
    """(fd, size) of a regular file opened read-only; links, folders, fifos and devices are refused.

    The file is first opened with O_PATH (which never blocks nor has a device's open side effects),
    checked to be a regular file, then reopened for reading through /proc/self/fd; where /proc is
    missing it is opened O_NONBLOCK and checked to be the same file. The caller closes fd."""
    parts = clean_relpath(path)
    dir_fd = _open_dir(root, parts[:-1])
    try:
        leaf = parts[-1]
        try:
            pfd = os.open(leaf, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            raise _not_found(parts) from None
        try:
            st = os.fstat(pfd)
            _check_regular(st.st_mode, parts)
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
            try:
                fd = os.open(f"/proc/self/fd/{pfd}", flags & ~os.O_NOFOLLOW)
            except FileNotFoundError:
                try:
                    fd = os.open(leaf, flags, dir_fd=dir_fd)
                except FileNotFoundError:
                    raise _not_found(parts) from None
                except OSError as e:
                    if e.errno == errno.ELOOP:
                        raise PathRefused(_LINK_REFUSAL.format(_shown(parts))) from None
                    raise
        finally:
            os.close(pfd)
    finally:
        os.close(dir_fd)
    try:
        now = os.fstat(fd)
        _check_regular(now.st_mode, parts)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise PathRefused(f"{_shown(parts)} changed while it was being opened; try again")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, now.st_size


def _check_regular(mode: int, parts: tuple[str, ...]) -> None:
    if _stat.S_ISREG(mode):
        return
    if _stat.S_ISLNK(mode):
        raise PathRefused(_LINK_REFUSAL.format(_shown(parts)))
    if _stat.S_ISDIR(mode):
        raise PathRefused(f"{_shown(parts)} is a folder, not a file")
    raise PathRefused(f"{_shown(parts)} is not a regular file")


def usage(root: Path) -> tuple[int, int]:
    """(bytes, files) under root: regular files count their size; links and other non-directories count
    as files of 0 bytes; links are never followed and entries vanishing meanwhile are ignored."""
    total = files = 0
    stack = [_open_root(root)]
    try:
        while stack:
            fd = stack.pop()
            try:
                try:
                    names = os.listdir(fd)
                except FileNotFoundError:
                    continue
                for name in names:
                    st = _lstat(fd, name)
                    if st is None:
                        continue
                    if _stat.S_ISDIR(st.st_mode):
                        try:
                            stack.append(os.open(name, _DIR_FLAGS, dir_fd=fd))
                        except OSError as e:
                            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                                raise
                        continue
                    files += 1
                    if _stat.S_ISREG(st.st_mode):
                        total += st.st_size
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return total, files


class Staging:
    """Uploads land in a staging folder (on the same filesystem as the folders, e.g. <host root>/.staging),
    then are moved into place atomically, so a file appears in a folder only when complete.

    Staging files are named by their upload token. A commit that is refused leaves the staging file in
    place (the caller may retry with another path, or discard it)."""

    def __init__(self, dir: Path) -> None:
        self.dir = Path(dir)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)

    def _name(self, token: str) -> str:
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise PathRefused("an upload token is 16 to 128 letters, digits, '_' or '-'")
        return token

    def _open(self, token: str, flags: int) -> int:
        try:
            return os.open(self.dir / self._name(token), flags | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound("no such upload: it was never started, or was committed, discarded or expired") from None

    def create(self, token: str) -> None:
        """Start an upload: an empty staging file named by token."""
        try:
            fd = os.open(
                self.dir / self._name(token), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except FileExistsError:
            raise AlreadyExists("an upload with this token already exists") from None
        os.close(fd)

    def append(self, token: str, data: bytes, offset: int) -> int:
        """Write data at offset, which must be the bytes received so far; returns the new size.

        All or nothing: should a write fail (a full disk), the file is cut back to `offset`, so that the
        upload can go on from there (and the space it took is free again)."""
        fd = self._open(token, os.O_WRONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # two appends to one upload must not both pass the offset check
            size = os.fstat(fd).st_size
            if offset != size:
                raise ValueError(f"offset {offset} does not match the {size} bytes received")
            view = memoryview(data).cast("B")
            pos = offset
            try:
                while view:
                    n = os.pwrite(fd, view, pos)
                    view = view[n:]
                    pos += n
            except OSError:
                os.ftruncate(fd, offset)
                raise
            return pos
        finally:
            os.close(fd)

    def size(self, token: str) -> int:
        """Bytes received so far."""
        fd = self._open(token, os.O_RDONLY)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def commit(
        self,
        token: str,
        root: Path,
        path: str,
        *,
        uid: int | None = None,
        gid: int | None = None,
        overwrite: bool = True,
    ) -> None:
        """Move the upload to root/path atomically (mode 0o664, owned by uid/gid when given), making
        missing parent directories. A directory or link at path is refused; so is an existing file
        unless overwrite. On any refusal the staging file stays."""
        parts = clean_relpath(path)
        fd = self._open(token, os.O_RDONLY)
        try:
            _chown(fd, uid, gid)
            os.fchmod(fd, FILE_MODE)
        finally:
            os.close(fd)
        staging_fd = os.open(self.dir, _DIR_FLAGS)
        try:
            dir_fd = _open_dir(root, parts[:-1], create=True, uid=uid, gid=gid)
            try:
                leaf = parts[-1]
                st = _lstat(dir_fd, leaf)
                if st is not None:
                    if _stat.S_ISLNK(st.st_mode):
                        raise PathRefused(_LINK_REFUSAL.format(_shown(parts)))
                    if _stat.S_ISDIR(st.st_mode):
                        raise PathRefused(f"{_shown(parts)} is a folder")
                    if not overwrite:
                        raise AlreadyExists(f"{_shown(parts)} already exists")
                try:
                    if overwrite:
                        os.rename(token, leaf, src_dir_fd=staging_fd, dst_dir_fd=dir_fd)
                    else:  # link() never replaces: no window for a file appearing since the check
                        os.link(token, leaf, src_dir_fd=staging_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                        os.unlink(token, dir_fd=staging_fd)
                except FileNotFoundError:
                    raise NotFound("no such upload: it was committed or discarded meanwhile") from None
                except FileExistsError:
                    raise AlreadyExists(f"{_shown(parts)} already exists") from None
                except IsADirectoryError:
                    raise PathRefused(f"{_shown(parts)} is a folder") from None
                except OSError as e:
                    if e.errno == errno.EXDEV:
                        raise OSError(
                            errno.EXDEV, "the staging folder is not on the same filesystem as the folders"
                        ) from None
                    raise
            finally:
                os.close(dir_fd)
        finally:
            os.close(staging_fd)

    def discard(self, token: str) -> None:
        """Remove an upload, if it is there."""
        try:
            os.unlink(self.dir / self._name(token))
        except FileNotFoundError:
            pass

    def sweep(self, older_than: float) -> int:
        """Remove staging files last written more than older_than seconds ago; returns how many."""
        cutoff = time.time() - older_than
        removed = 0
        for name in os.listdir(self.dir):
            try:
                st = os.lstat(self.dir / name)
                if not _stat.S_ISDIR(st.st_mode) and st.st_mtime < cutoff:
                    os.unlink(self.dir / name)
                    removed += 1
            except FileNotFoundError:
                pass
        return removed
