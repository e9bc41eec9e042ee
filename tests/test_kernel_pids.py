"""Processes are host-wide: kernels together hold at most half of the host's process ids, each in
proportion to its cpu share, so one user's small sessions cannot fork the node out of processes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bai.node.agent.backends.docker import MIN_KERNEL_PIDS, PID_SHARE, kernel_pids_limit
from tests.nodeproc import Node


def test_a_kernels_pids_follow_its_cpu_share_under_the_configured_limit() -> None:
    # a 2-core host with Linux's default pid_max (32768): the configured 4096 for a core, less for less
    assert kernel_pids_limit(4096, 1.0, 2, 32768) == 4096
    assert kernel_pids_limit(4096, 0.5, 2, 32768) == 4096
    assert kernel_pids_limit(4096, 0.1, 2, 32768) == 819
    assert kernel_pids_limit(4096, 0.001, 2, 32768) == MIN_KERNEL_PIDS
    assert kernel_pids_limit(64, 0.1, 2, 32768) == 64  # an operator's lower limit wins
    assert kernel_pids_limit(0, 2.0, 2, 32768) == 16384  # no limit of its own: still the share


@given(st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=200), st.integers(1, 256))
def test_kernels_filling_the_host_hold_at_most_half_its_pids(tenths: list[int], cores: int) -> None:
    """However the host's cpu is cut into kernels (0.1 cpu each at least), their limits add up to at most
    PID_SHARE of pid_max (plus the floor of the tiniest)."""
    pid_max = max(32768, 1024 * cores)
    cpus, total = [], 0.0
    for t in tenths:
        if total + t / 10 > cores:
            break
        cpus.append(t / 10)
        total += t / 10
    held = sum(kernel_pids_limit(4096, c, cores, pid_max) for c in cpus)
    floor_extra = sum(MIN_KERNEL_PIDS for c in cpus if pid_max * PID_SHARE * c / cores < MIN_KERNEL_PIDS)
    assert held <= pid_max * PID_SHARE + floor_extra


READ = (
    "import os\np = '/sys/fs/cgroup/pids/pids.max'\n"
    "print(open(p if os.path.exists(p) else '/sys/fs/cgroup/pids.max').read().strip())"
)


def test_a_small_docker_kernel_gets_its_share_of_pids(docker_node: Node) -> None:
    import os

    from bai.node.agent.backends.docker import host_pid_max

    result = docker_node.cli("session", "run", "python", "--cpu", "0.1", "--mem", "128m", "-c", READ)
    assert result.returncode == 0, result.stderr
    want = kernel_pids_limit(4096, 0.1, os.cpu_count() or 1, host_pid_max())
    assert result.stdout.strip() == str(want), (result.stdout, want)
