"""`--mount NAME[:PATH][:ro]` and the checks of mount targets (pure)."""

from __future__ import annotations

import pytest

from bai.common.mounts import MountError, MountRequest, mount_config, parse_mount_arg, plan_mounts


def test_parse_mount_flag() -> None:
    assert parse_mount_arg("data") == ("data", None, False)
    assert parse_mount_arg("data:ro") == ("data", None, True)
    assert parse_mount_arg("data:inputs") == ("data", "inputs", False)
    assert parse_mount_arg("data:/mnt/x:ro") == ("data", "/mnt/x", True)
    assert parse_mount_arg("data:inputs:rw") == ("data", "inputs", False)
    for bad in ("", ":x", "a:b:c:d"):
        with pytest.raises(MountError):
            parse_mount_arg(bad)


def test_targets_default_relative_absolute_and_refused() -> None:
    plan = plan_mounts(["a", "b", "c"], {"b": "in/b", "c": "/data/c"}, {"a": {"permission": "ro"}})
    assert plan == [
        MountRequest("a", "/home/work/a", True),
        MountRequest("b", "/home/work/in/b", False),
        MountRequest("c", "/data/c", False),
    ]
    for path, words in (
        ("/etc", "system path"),
        ("/usr/local/x", "system path"),
        ("/proc/1", "system path"),
        ("/tmp/x", "system path"),
        ("/", "system path"),
        ("/home/other", "system path"),
        ("/home/work", "home"),
        ("../x", "'..'"),
        ("a/../../etc", "'..'"),
    ):
        with pytest.raises(MountError, match=words):
            plan_mounts(["a"], {"a": path}, {})


def test_overlapping_targets_and_bad_shapes_are_refused() -> None:
    with pytest.raises(MountError, match="overlap"):
        plan_mounts(["a", "b"], {"a": "x", "b": "x/y"}, {})
    with pytest.raises(MountError, match="overlap"):
        plan_mounts(["a", "b"], {"a": "/data", "b": "/data"}, {})
    with pytest.raises(MountError, match="list of folder names"):
        plan_mounts("a", {}, {})
    with pytest.raises(MountError, match="ro or rw"):
        plan_mounts(["a"], {}, {"a": {"permission": "wd"}})
    # a name only in mount_map is mounted too (as Backend.AI does)
    assert [m.name for m in plan_mounts([], {"a": "x"}, {})] == ["a"]
    assert mount_config(["data:in:ro", "other"]) == {
        "mounts": ["data", "other"],
        "mount_map": {"data": "in"},
        "mount_options": {"data": {"permission": "ro"}},
    }
