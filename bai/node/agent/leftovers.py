"""Clean-up that can fail, said out loud: what was left behind (a container, a folder, a process group) and
why, as a WARNING, instead of an error swallowed whole.

    with leftovers.step(f"folder {path}", remedy=f"rm -rf {path}"):
        ...  # the clean-up; FileNotFoundError (already gone) stays silent, any other error is logged

A clean-up step never raises what it logs: the caller goes on cleaning (and reports the error that made it
clean up, not this one). Errors that mean the thing is already gone are expected and stay silent: name
them (`gone=`) precisely, never `Exception`.

`remove_networks`: at a Docker agent's start, the networks of its multi-container sessions that no
kernel uses any more (its sessions' kernels died with it, or were removed while it was down), with their
peer proxies. Only the agent's own: labelled with its id (and named for it, bai/common/cluster.network_name),
so an agent never removes what another agent on the same Docker daemon holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiodocker

log = logging.getLogger("bai.agent.leftovers")


def detail(error: BaseException) -> str:
    """The error in a few words: a DockerError's message, an OSError's text, else its type and text."""
    message = getattr(error, "message", None)  # aiodocker's DockerError
    if isinstance(message, str) and message:
        status = getattr(error, "status", None)
        return f"{message} (status {status})" if status else message
    text = str(error)
    if isinstance(error, OSError) and text:
        return text  # [Errno 13] Permission denied: '…'
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def report(
    what: str,
    error: BaseException,
    *,
    action: str = "remove",
    remedy: str = "",
    left_behind: bool = True,
    logger: logging.Logger | None = None,
) -> None:
    """Log (WARNING) that `what` could not be removed (or closed, killed: `action`) and is left behind, with
    the error and, when given, how to remove it by hand."""
    message = f"could not {action} {what}: {detail(error)}"
    if left_behind:
        message += "; it is left behind"
        if remedy:
            message += f": {remedy}"
    elif remedy:
        message += f" ({remedy})"
    (logger or log).warning("%s", message)


@contextlib.contextmanager
def step(
    what: str,
    *,
    action: str = "remove",
    remedy: str = "",
    gone: tuple[type[BaseException], ...] = (FileNotFoundError,),
    errors: tuple[type[BaseException], ...] = (Exception,),
    left_behind: bool = True,
    logger: logging.Logger | None = None,
) -> Iterator[None]:
    """A clean-up step: errors in `gone` (the thing is already gone) are silent, other `errors` are
    reported (see `report`) and not raised. Cancellation (not an Exception) passes through."""
    try:
        yield
    except gone:
        pass
    except errors as e:
        report(what, e, action=action, remedy=remedy, left_behind=left_behind, logger=logger)


def remove_tree(path: Path, what: str = "folder", *, logger: logging.Logger | None = None) -> bool:
    """`rm -rf path`, saying what could not be removed (once, with the first error; files already gone are
    fine). True when nothing is left."""
    if path.is_symlink() or not path.is_dir():  # a file, a link, or nothing at all
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            report(f"{what} {path}", e, remedy=f"rm -f {path}", logger=logger)
            return False
        return True
    failures: list[tuple[str, BaseException]] = []

    def failed(
        _func: Callable[..., object],
        name: str,
        error: BaseException | tuple[type[BaseException], BaseException, TracebackType],
    ) -> None:
        error = error if isinstance(error, BaseException) else error[1]  # onexc: the error; onerror: exc_info
        if not isinstance(error, FileNotFoundError):
            failures.append((name, error))

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=failed)
    else:
        shutil.rmtree(path, onerror=failed)
    if not failures:
        return True
    name, error = failures[0]
    more = f", and {len(failures) - 1} more" if len(failures) > 1 else ""
    where = f" ({name}{more})" if os.fspath(name) != os.fspath(path) or more else ""
    report(f"{what} {path}{where}", error, remedy=f"rm -rf {path}", logger=logger)
    return False


def _labels(info: dict[str, Any]) -> dict[str, Any]:
    """A container's or network's labels, from what Docker lists (`Labels`, for containers also under
    `Config`)."""
    labels = info.get("Labels")
    if labels is None:
        labels = (info.get("Config") or {}).get("Labels")
    return labels if isinstance(labels, dict) else {}


async def remove_networks(
    docker: aiodocker.Docker,
    agent_id: str,
    keep: Collection[str] = (),
    *,
    prefix: str = "bai-cluster-",
    agent_label: str = "bai.agent",
    peer_label: str = "bai.peer",
    logger: logging.Logger | None = None,
) -> list[str]:
    """At an agent's start: remove the Docker networks of its multi-container sessions (named `prefix`…,
    labelled `agent_label`=`agent_id`) that no kernel uses, but those named in `keep`; a network left by
    an agent that died before its session's last kernel was removed. First the session's peer proxies
    (containers labelled `agent_label`=`agent_id` and `peer_label`) on a network not in `keep` go, running
    or not: they are not kernels. `docker`: an aiodocker.Docker. Each failure is reported (WARNING) and the
    clean-up goes on; returns the names of the networks removed."""
    from aiodocker.exceptions import DockerError
    from aiodocker.networks import DockerNetwork

    logger = logger or log
    try:
        proxies = await docker.containers.list(all=True, filters={"label": [f"{agent_label}={agent_id}", peer_label]})
    except DockerError as e:
        report(f"the peer proxies of agent {agent_id}", e, action="list", left_behind=False, logger=logger)
        proxies = []
    for proxy in proxies:
        info = getattr(proxy, "_container", {}) or {}
        if _labels(info).get(agent_label) != agent_id:
            continue  # another agent's (on the same daemon): never ours to remove
        network_mode = str((info.get("HostConfig") or {}).get("NetworkMode") or "")
        if network_mode in keep:
            continue  # a session whose kernels the agent adopted: its proxies stay
        short = str(proxy.id)[:12]
        with step(f"container {short} (a peer proxy)", remedy=f"remove it with `docker rm -f {short}`", logger=logger):
            try:
                await proxy.delete(force=True, v=True)
            except DockerError as e:
                if e.status != 404:  # gone meanwhile
                    raise
            else:
                logger.info("removed peer proxy %s: no kernel of its session is left", short)
    try:
        found = await docker.networks.list(filters={"label": [f"{agent_label}={agent_id}"], "name": [prefix]})
    except DockerError as e:
        report(f"the networks of agent {agent_id}", e, action="list", left_behind=False, logger=logger)
        return []
    removed = []
    for net in found:
        name = str(net.get("Name") or "")
        if not name.startswith(prefix) or name in keep or _labels(net).get(agent_label) != agent_id:
            continue  # not a session network, one in use, or another agent's (on the same daemon)
        network = DockerNetwork(docker, net["Id"])  # type: ignore[no-untyped-call]  # aiodocker: __init__ unannotated
        with step(f"network {name}", remedy=f"remove it with `docker network rm {name}`", logger=logger):
            try:
                if (await network.show()).get("Containers"):
                    continue  # a kernel still on it (the agent did not adopt it, yet it runs): not a leftover
                await network.delete()
            except DockerError as e:
                if e.status == 404:
                    continue  # gone meanwhile
                raise
            removed.append(name)
            logger.info("removed network %s: no kernel of its session is left", name)
    return removed
