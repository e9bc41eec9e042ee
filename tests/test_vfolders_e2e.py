"""Virtual folders end to end: real nodes (Docker kernels and local kernels under bubblewrap), the CLI
and the HTTP API; files checked on the host and inside kernels."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bai.client.api import APIError
from tests.nodeproc import Node
from tests.tui_support import node_client


@pytest.fixture(scope="module", params=["docker", "local"])
def vnode(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Node]:
    if request.param == "docker":
        request.getfixturevalue("python_image")
    elif subprocess.run(["which", "bwrap"], capture_output=True).returncode != 0:
        if os.environ.get("BAI_REQUIRE_DOCKER") == "1":
            pytest.fail("bubblewrap is missing (CI installs it: apt-get install bubblewrap)")
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    node = Node(tmp_path_factory.mktemp(f"vf-{request.param}"), request.param).start()
    yield node
    left = node.leftover_containers(settle=10)  # (removals finish in the background)
    node.stop()
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)


def folder_dir(node: Node, name: str, as_keypair=None) -> Path:
    info = node.json("vfolder", "info", name, as_keypair=as_keypair)
    return node.state_dir / "vfolders" / info["id"]


def run(node: Node, *args: str, as_keypair=None) -> subprocess.CompletedProcess[str]:
    return node.cli("session", "run", *args, as_keypair=as_keypair, timeout=120)


def test_a_kernel_writes_the_host_reads_and_a_second_kernel_sees_it(vnode: Node, tmp_path: Path) -> None:
    vnode.cli("vfolder", "create", "shared-data", check=True)
    (tmp_path / "in.txt").write_text("from the host\n")
    vnode.cli("vfolder", "upload", "shared-data", str(tmp_path / "in.txt"), check=True)
    code = (
        "import os; print(open('/home/work/shared-data/in.txt').read().strip()); "
        "os.makedirs('/home/work/shared-data/out', exist_ok=True); "
        "open('/home/work/shared-data/out/result.txt', 'w').write('42 from kernel 1')"
    )
    first = run(vnode, "--mount", "shared-data", "python", "-c", code)
    assert first.returncode == 0, first.stderr
    assert "from the host" in first.stdout
    # on the host, in the folder's directory, as a file its owner can read (and bai can delete)
    written = folder_dir(vnode, "shared-data") / "out" / "result.txt"
    assert written.read_text() == "42 from kernel 1"
    if vnode.backend == "docker":
        assert written.stat().st_uid == 1000, "files written by a docker kernel belong to the kernel's user"
    second = run(
        vnode, "--mount", "shared-data:data", "python", "-c", "print(open('/home/work/data/out/result.txt').read())"
    )
    assert second.returncode == 0 and "42 from kernel 1" in second.stdout, second.stderr
    listed = vnode.json("vfolder", "ls-files", "shared-data", "out")
    assert [(f["name"], f["type"], f["size"]) for f in listed] == [("result.txt", "file", 16)]
    dl = tmp_path / "dl"
    dl.mkdir()
    vnode.cli("vfolder", "download", "shared-data", "out/result.txt", "--dest", str(dl), check=True)
    assert (dl / "result.txt").read_text() == "42 from kernel 1"
    again = vnode.cli("vfolder", "download", "shared-data", "out/result.txt", "--dest", str(dl))
    assert again.returncode != 0 and "not overwriting" in again.stderr


def test_read_only_mount_refuses_writes_inside_the_kernel(vnode: Node) -> None:
    vnode.cli("vfolder", "create", "ro-data", check=True)
    result = run(vnode, "--mount", "ro-data:ro", "python", "-c", "open('/home/work/ro-data/x', 'w').write('no')")
    assert result.returncode != 0 and "Read-only file system" in result.stderr
    assert not (folder_dir(vnode, "ro-data") / "x").exists()


def test_mount_requests_are_checked(vnode: Node) -> None:
    vnode.cli("vfolder", "create", "chk-data", check=True)
    bad = run(vnode, "--mount", "chk-data:/etc", "python", "-c", "print(1)")
    assert bad.returncode == 2 and "system path" in bad.stderr
    overlap = run(vnode, "--mount", "chk-data:a", "--mount", "chk-data2:a/b", "python", "-c", "print(1)")
    assert overlap.returncode == 2 and "overlap" in overlap.stderr
    unknown = run(vnode, "--mount", "no-such-folder", "python", "-c", "print(1)")
    assert unknown.returncode != 0 and "no-such-folder" in unknown.stderr and "does not exist" in unknown.stderr


def test_dotfiles_land_in_every_new_kernel(vnode: Node) -> None:
    vnode.cli("dotfile", "add", ".config/bai-test/rc", "--data", "answer=42\n", check=True)
    assert [d["path"] for d in vnode.json("dotfile", "ls")] == [".config/bai-test/rc"]
    # the kernel's home: /home/work in a container, its own folder for a local kernel without mounts
    code = "import os; print(open(os.path.expanduser('~/.config/bai-test/rc')).read())"
    result = run(vnode, "python", "-c", code)
    assert result.returncode == 0 and "answer=42" in result.stdout, result.stderr
    vnode.cli("dotfile", "rm", ".config/bai-test/rc", check=True)
    assert vnode.json("dotfile", "ls") == []


def test_sharing_read_only_and_read_write(vnode: Node, tmp_path: Path) -> None:
    ro_user = vnode.json("keypair", "create", "--user", f"reader-{vnode.backend}")
    rw_user = vnode.json("keypair", "create", "--user", f"writer-{vnode.backend}")
    stranger = vnode.json("keypair", "create", "--user", f"stranger-{vnode.backend}")
    vnode.cli("vfolder", "create", "team", check=True)
    (tmp_path / "notes.txt").write_text("owner's notes")
    vnode.cli("vfolder", "upload", "team", str(tmp_path / "notes.txt"), check=True)
    vnode.cli("vfolder", "share", "team", ro_user["accessKey"], "--permission", "ro", check=True)
    vnode.cli("vfolder", "share", "team", f"writer-{vnode.backend}", "--permission", "rw", check=True)
    shares = vnode.json("vfolder", "info", "team")["shares"]
    assert shares == {ro_user["accessKey"]: "ro", rw_user["accessKey"]: "rw"}

    # the read-only sharee sees it among the shared ones, reads it, and mounts it read-only even asking rw
    listed = vnode.json("vfolder", "ls", "--shared", as_keypair=ro_user)
    assert [(f["name"], f["permission"], f["isOwner"]) for f in listed] == [("team", "ro", False)]
    denied = vnode.cli("vfolder", "upload", "team", str(tmp_path / "notes.txt"), as_keypair=ro_user)
    assert denied.returncode != 0 and "read-only" in denied.stderr
    code = "open('/home/work/team/by-reader', 'w').write('x')"
    result = run(vnode, "--mount", "team", "python", "-c", code, as_keypair=ro_user)
    assert result.returncode != 0 and "Read-only file system" in result.stderr
    ok = run(
        vnode, "--mount", "team", "python", "-c", "print(open('/home/work/team/notes.txt').read())", as_keypair=ro_user
    )
    assert ok.returncode == 0 and "owner's notes" in ok.stdout

    # the read-write sharee writes; neither sharee may delete, rename or share it
    written = run(
        vnode,
        "--mount",
        "team",
        "python",
        "-c",
        "open('/home/work/team/by-writer', 'w').write('w')",
        as_keypair=rw_user,
    )
    assert written.returncode == 0, written.stderr
    assert (folder_dir(vnode, "team") / "by-writer").read_text() == "w"
    for args in (("rm", "team"), ("rename", "team", "mine-now"), ("share", "team", stranger["accessKey"])):
        refused = vnode.cli("vfolder", *args, as_keypair=rw_user)
        assert refused.returncode != 0 and "only the owner" in refused.stderr, args

    # a keypair it is not shared with cannot tell it exists: 404 everywhere, mounting included
    for args in (("info", "team"), ("ls-files", "team"), ("upload", "team", str(tmp_path / "notes.txt"))):
        hidden = vnode.cli("vfolder", *args, as_keypair=stranger)
        assert hidden.returncode != 0 and "does not exist" in hidden.stderr, args
    hidden = run(vnode, "--mount", "team", "python", "-c", "print(1)", as_keypair=stranger)
    assert hidden.returncode != 0 and "does not exist" in hidden.stderr

    vnode.cli("vfolder", "unshare", "team", ro_user["accessKey"], check=True)
    gone = vnode.cli("vfolder", "info", "team", as_keypair=ro_user)
    assert gone.returncode != 0 and "does not exist" in gone.stderr


async def test_every_path_traversal_is_refused_and_nothing_outside_is_touched(vnode: Node, tmp_path: Path) -> None:
    vnode.cli("vfolder", "create", "guarded", check=True)
    outside = vnode.base / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "secret.txt").write_text("secret")
    before = sorted(p.name for p in outside.iterdir())
    # a kernel plants links inside its folder: to a directory and to a file outside it
    plant = (
        f"import os; os.symlink('{outside}', '/home/work/guarded/evil-dir'); "
        f"os.symlink('{outside}/secret.txt', '/home/work/guarded/evil-file'); "
        "os.symlink('/etc/passwd', '/home/work/guarded/passwd')"
    )
    planted = run(vnode, "--mount", "guarded", "python", "-c", plant)
    assert planted.returncode == 0, planted.stderr
    client = node_client(vnode)
    (tmp_path / "f").write_bytes(b"payload")
    attempts = [
        lambda: client.upload_file("guarded", tmp_path / "f", "../escaped"),
        lambda: client.upload_file("guarded", tmp_path / "f", "/tmp/escaped"),
        lambda: client.upload_file("guarded", tmp_path / "f", "a\x00b"),
        lambda: client.upload_file("guarded", tmp_path / "f", "evil-dir/dropped"),
        lambda: client.download_file("guarded", "evil-file", tmp_path / "stolen"),
        lambda: client.download_file("guarded", "passwd", tmp_path / "stolen"),
        lambda: client.download_file("guarded", "evil-dir/secret.txt", tmp_path / "stolen"),
        lambda: client.download_file("guarded", "../../../../etc/passwd", tmp_path / "stolen"),
        lambda: client.vfolder_files("guarded", "evil-dir"),
        lambda: client.vfolder_files("guarded", ".."),
        lambda: client.vfolder_action("guarded", "mkdir", path="evil-dir/new"),
        lambda: client.vfolder_action("guarded", "mkdir", path="../new"),
        lambda: client.vfolder_action("guarded", "rename-file", target_path="evil-dir/secret.txt", new_path="got"),
        lambda: client.vfolder_action("guarded", "rename-file", target_path="passwd", new_path="../moved"),
        lambda: client.vfolder_action("guarded", "delete-files", "DELETE", files=["evil-dir/secret.txt"]),
        lambda: client.vfolder_action("guarded", "delete-files", "DELETE", files=["../outside"], recursive=True),
    ]
    for i, attempt in enumerate(attempts):
        with pytest.raises(APIError) as err:
            await attempt()
        assert 400 <= err.value.status < 500, (i, err.value.status, str(err.value))
        assert str(err.value), i
    assert sorted(p.name for p in outside.iterdir()) == before
    assert (outside / "secret.txt").read_text() == "secret"
    assert not (tmp_path / "stolen").exists()
    assert not (vnode.state_dir / "vfolders" / "escaped").exists()
    # the links themselves may be removed (that does not go through them)
    await client.vfolder_action("guarded", "delete-files", "DELETE", files=["evil-dir", "evil-file", "passwd"])
    assert (outside / "secret.txt").read_text() == "secret"
    assert await client.vfolder_files("guarded") == []


async def test_an_interrupted_upload_leaves_nothing(vnode: Node) -> None:
    vnode.cli("vfolder", "create", "partial", check=True)
    client = node_client(vnode)
    grant = await client.request("POST", "/folders/partial/request-upload", json_body={"path": "big.bin", "size": 1000})
    conn = http.client.HTTPConnection("127.0.0.1", vnode.port, timeout=30)
    headers = {"Tus-Resumable": "1.0.0", "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream"}
    conn.request("PATCH", f"/folders/_/tus/upload?token={grant['token']}", body=b"x" * 400, headers=headers)
    resp = conn.getresponse()
    assert resp.status == 204 and resp.headers["Upload-Offset"] == "400"
    resp.read()
    # a chunk that does not continue where the upload stands is refused
    bad = dict(headers, **{"Upload-Offset": "100"})
    conn.request("PATCH", f"/folders/_/tus/upload?token={grant['token']}", body=b"y" * 10, headers=bad)
    resp = conn.getresponse()
    assert resp.status == 400 and "offset" in json.loads(resp.read())["msg"]
    conn.close()  # the client goes away: 600 of 1000 bytes never come
    assert await client.vfolder_files("partial") == []
    assert list(folder_dir(vnode, "partial").iterdir()) == []
    # a token is needed, and a wrong one gets nowhere
    conn = http.client.HTTPConnection("127.0.0.1", vnode.port, timeout=30)
    conn.request("PATCH", "/folders/_/tus/upload?token=forged-token-0000", body=b"z", headers=headers)
    assert conn.getresponse().status == 401
    conn.close()


async def test_quotas_on_folder_count_and_size(vnode: Node, tmp_path: Path) -> None:
    vnode.cli(
        "policy", "create", f"small-folders-{vnode.backend}", "--max-vfolders", "1", "--vfolder-size", "1k", check=True
    )
    user = vnode.json(
        "keypair", "create", "--user", f"quota-{vnode.backend}", "--policy", f"small-folders-{vnode.backend}"
    )
    vnode.cli("vfolder", "create", "only-one", check=True, as_keypair=user)
    second = vnode.cli("vfolder", "create", "second-one", as_keypair=user)
    assert second.returncode != 0 and "allows 1 folders" in second.stderr
    (tmp_path / "small").write_bytes(b"s" * 600)
    (tmp_path / "large").write_bytes(b"L" * 2000)
    vnode.cli("vfolder", "upload", "only-one", str(tmp_path / "small"), check=True, as_keypair=user)
    over = vnode.cli("vfolder", "upload", "only-one", str(tmp_path / "large"), as_keypair=user)
    assert over.returncode != 0 and "quota" in over.stderr.lower() and "do not fit" in over.stderr
    names = [f["name"] for f in vnode.json("vfolder", "ls-files", "only-one", as_keypair=user)]
    assert names == ["small"], "no partial data of the refused upload"
    # a kernel may write past the quota (it is not blocked), but then uploads are refused
    code = "open('/home/work/only-one/from-kernel', 'wb').write(b'k' * 800)"
    assert run(vnode, "--mount", "only-one", "python", "-c", code, as_keypair=user).returncode == 0
    (tmp_path / "tiny").write_bytes(b"t")
    blocked = vnode.cli("vfolder", "upload", "only-one", str(tmp_path / "tiny"), as_keypair=user)
    assert blocked.returncode != 0 and "quota" in blocked.stderr.lower()
    assert vnode.json("vfolder", "info", "only-one", as_keypair=user)["usedBytes"] == 1400


def test_trash_restore_purge_and_a_mounted_folder_stays(vnode: Node, tmp_path: Path) -> None:
    vnode.cli("vfolder", "create", "bin-me", check=True)
    (tmp_path / "keep.txt").write_text("k")
    vnode.cli("vfolder", "upload", "bin-me", str(tmp_path / "keep.txt"), check=True)
    path = folder_dir(vnode, "bin-me")
    vnode.cli("session", "create", "python", "--name", "holds-bin-me", "--mount", "bin-me", check=True)
    try:
        mounts = vnode.json("session", "info", "holds-bin-me")["mounts"]
        assert [(m["name"], m["target"], m["readOnly"]) for m in mounts] == [("bin-me", "/home/work/bin-me", False)]
        assert "Mount       bin-me at /home/work/bin-me" in vnode.cli("session", "info", "holds-bin-me").stdout
        busy = vnode.cli("vfolder", "rm", "bin-me")
        assert busy.returncode != 0 and "holds-bin-me" in busy.stderr
    finally:
        vnode.cli("session", "destroy", "holds-bin-me", check=True)
    vnode.cli("vfolder", "rm", "bin-me", check=True)
    assert "bin-me" not in [f["name"] for f in vnode.json("vfolder", "ls")]
    assert [f["name"] for f in vnode.json("vfolder", "ls", "--trash")] == ["bin-me"]
    assert (path / "keep.txt").exists(), "the trash keeps the files"
    vnode.cli("vfolder", "restore", "bin-me", check=True)
    assert vnode.json("vfolder", "ls-files", "bin-me")[0]["name"] == "keep.txt"
    vnode.cli("vfolder", "rm", "bin-me", check=True)
    vnode.cli("vfolder", "purge", "bin-me", check=True)
    assert not path.exists()
    assert vnode.json("vfolder", "ls", "--trash") == [] or "bin-me" not in [
        f["name"] for f in vnode.json("vfolder", "ls", "--trash")
    ]


def test_a_split_cluster_places_mounting_sessions_only_on_agents_that_see_the_host(tmp_path: Path) -> None:
    import time

    from tests.nodeproc import Cluster

    # the first agent keeps its own state folder: it does not see the manager's vfolder root
    cluster = Cluster(tmp_path / "c", "sim", agents=1).start()
    try:
        cluster.cli("vfolder", "create", "needs-host", check=True)
        cluster.cli(
            "session", "create", "sim", "--name", "with-folder", "--mount", "needs-host", "--no-wait", check=True
        )
        cluster.cli("session", "create", "sim", "--name", "without-folder", check=True)
        assert cluster.json("session", "info", "without-folder")["agent"] == cluster.agents[0].agent_id
        deadline = time.monotonic() + 20
        while (
            "sees vfolder host"
            not in (info := cluster.json("session", "info", "with-folder"))["statusData"]
            .get("scheduler", {})
            .get("msg", "")
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert info["status"] == "PENDING"
        assert "no agent of scaling group default sees vfolder host local" in info["statusData"]["scheduler"]["msg"]
        # an agent configured with the manager's root (a shared filesystem; here the same disk) sees it
        root = cluster.manager.state_dir / "vfolders"
        seeing = cluster.add_agent(1, extra_config=f'[vfolders]\nhosts = {{ local = "{root}" }}\n').start()
        cluster.agents.append(seeing)
        deadline = time.monotonic() + 20
        while (info := cluster.json("session", "info", "with-folder"))["status"] != "RUNNING":
            assert time.monotonic() < deadline, info
            time.sleep(0.1)
        assert info["agent"] == seeing.agent_id
    finally:
        cluster.stop()


def test_local_kernels_without_bubblewrap_refuse_mounts_clearly(tmp_path: Path) -> None:
    node = Node(tmp_path / "no-bwrap", "local")
    node.env["PATH"] = str(tmp_path / "empty-bin")  # no bwrap to be found (the node needs no other program)
    node.start()
    try:
        node.cli("vfolder", "create", "wants-bwrap", check=True)
        refused = run(node, "--mount", "wants-bwrap", "python", "-c", "print(1)")
        assert refused.returncode != 0 and "needs bubblewrap" in refused.stderr, refused.stderr
        plain = run(node, "python", "-c", "print('no mounts, no bubblewrap needed')")
        assert plain.returncode == 0 and "no bubblewrap needed" in plain.stdout
    finally:
        node.stop()
