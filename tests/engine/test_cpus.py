"""CPU sizing: the affinity mask, the cgroup quota (v2 and v1, from fake cgroup trees),
PCD_THREADS; the one thread budget every pool reads; threads per request from the runnable
neighbours; and the slow-BLAS warning worded for what was found (busy machine, bound but
slow, or no fast BLAS)."""

from __future__ import annotations

import pytest

from pcd_tools.engine.host import threads
from pcd_tools.engine.host.blas import BlasInfo, slow_blas_message
from pcd_tools.engine.host.cpus import busy, cgroup_quota, cpu_budget, runnable_others, usable_cpus
from pcd_tools.engine.host.threads import request_threads
from pcd_tools.errors import InvalidArgumentError

pytestmark = pytest.mark.unit

V2 = "0::/kubepods/pod1/ctr\n"
V1 = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n2:cpuset:/docker/abc\n"


def _file(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [("150000 100000\n", 1.5), ("max 100000\n", None), ("200000 100000", 2.0), ("x y", None)],
)
def test_cgroup_v2_quota_of_the_process_cgroup(tmp_path, text, want):
    _file(tmp_path / "kubepods/pod1/ctr/cpu.max", text)
    _file(tmp_path / "cpu.max", "max 100000\n")  # the root: never read first
    assert cgroup_quota(tmp_path, V2) == want


def test_cgroup_v2_quota_at_the_root_in_a_container(tmp_path):
    _file(tmp_path / "cpu.max", "50000 100000\n")
    assert cgroup_quota(tmp_path, "0::/\n") == 0.5


def test_cgroup_v1_cfs_quota(tmp_path):
    _file(tmp_path / "cpu/docker/abc/cpu.cfs_quota_us", "300000\n")
    _file(tmp_path / "cpu/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cgroup_quota(tmp_path, V1) == 3.0
    _file(tmp_path / "cpu/docker/abc/cpu.cfs_quota_us", "-1\n")  # no limit
    assert cgroup_quota(tmp_path, V1) is None


def test_no_cgroup_files_is_no_quota(tmp_path):
    assert cgroup_quota(tmp_path, "") is None


def test_budget_is_the_smallest_of_affinity_quota_and_the_override():
    b = cpu_budget(affinity=range(8), quota=1.5, env=None)
    assert (b.cpus, b.affinity, b.quota, b.source) == (2, 8, 1.5, "cgroup quota")
    b = cpu_budget(affinity=range(2), quota=16.0, env=None)
    assert (b.cpus, b.source) == (2, "affinity")
    b = cpu_budget(affinity=range(4), quota=None, env=None)
    assert (b.cpus, b.source) == (4, "affinity")
    assert cpu_budget(affinity=range(4), quota=0.2, env=None).cpus == 1
    b = cpu_budget(affinity=range(4), quota=2.0, env="3")
    assert (b.cpus, b.override, b.source) == (3, 3, "PCD_THREADS")


@pytest.mark.parametrize("env", ["0", "-2", "two", "1.5"])
def test_a_bad_pcd_threads_is_refused_by_name(env):
    with pytest.raises(InvalidArgumentError, match=f"PCD_THREADS={env!r}"):
        cpu_budget(affinity=range(2), quota=None, env=env)


def test_busy_compares_the_load_with_half_the_cpus():
    assert busy(2, 2.5) == (True, 2.5)
    assert busy(2, 2.0)[0] is True
    # issue 52: 1.99 on 2 CPUs, a pip install holding one, is not a quiet machine
    assert busy(2, 1.99) == (True, 1.99)
    assert busy(2, 1.0)[0] is True
    assert busy(2, 0.9) == (False, 0.9)
    assert busy(16, 7.5)[0] is False and busy(16, 8.0)[0] is True


def _info(bound: bool) -> BlasInfo:
    return BlasInfo(
        "openblas (system)" if bound else "mlx default",
        "/usr/lib/libopenblas.so.0" if bound else None,
        False,
        16.8,
        bound,
        "bound /usr/lib/libopenblas.so.0" if bound else "reference BLAS",
    )


def test_slow_blas_message_on_a_busy_machine_says_contention_not_reinstall(monkeypatch):
    monkeypatch.setenv("PCD_THREADS", "2")
    msg = slow_blas_message(_info(True), load=6.3)
    assert (
        "busy (load average 6.30 on 2 usable CPUs (PCD_THREADS): other processes hold all "
        "2 CPUs)" in msg
    )
    assert "nothing needs reinstalling" in msg and "pip install" not in msg


def test_slow_blas_message_words_the_load_it_measured(monkeypatch):
    # issue 52: a load of 1.99 on 2 CPUs, a pip install holding one, was "a quiet machine"
    monkeypatch.setenv("PCD_THREADS", "2")
    msg = slow_blas_message(_info(True), load=1.99)
    assert "quiet" not in msg and "nothing needs reinstalling" in msg
    assert (
        "busy (load average 1.99 on 2 usable CPUs (PCD_THREADS): another process holds a CPU)"
        in msg
    )
    monkeypatch.setenv("PCD_THREADS", "8")
    msg = slow_blas_message(_info(True), load=3.2)
    assert "not busy (load average 3.20 on 8 usable CPUs (PCD_THREADS): " in msg
    assert "other processes hold 3 of the 8 CPUs)" in msg


def test_slow_blas_message_when_bound_on_a_quiet_machine_names_quota(monkeypatch):
    monkeypatch.setenv("PCD_THREADS", "2")
    msg = slow_blas_message(_info(True), load=0.3)
    assert (
        "not busy (load average 0.30 on 2 usable CPUs (PCD_THREADS): no other process held a CPU)"
        in msg
    )
    assert "CPU quota" in msg and "pip install" not in msg


def test_slow_blas_message_without_a_fast_blas_says_how_to_install_one(monkeypatch):
    monkeypatch.setenv("PCD_THREADS", "2")
    msg = slow_blas_message(_info(False), load=6.3)
    assert "10-50x slower" in msg and "pip install scipy-openblas32" in msg


def _loadavg(*running):
    texts = iter(f"0.50 0.40 0.30 {n}/345 6789" for n in running)
    return lambda: next(texts)


def test_runnable_others_is_the_least_of_the_reads_less_the_reader():
    assert runnable_others(3, 0.0, _loadavg(4, 2, 3)) == 1  # a passing task is not counted
    assert runnable_others(3, 0.0, _loadavg(1, 1, 1)) == 0  # only the reader
    assert runnable_others(1, 0.0, _loadavg(5)) == 4


@pytest.mark.parametrize("text", ["", "garbage", "0.5 0.4 0.3", "0.5 0.4 0.3 x/10 1"])
def test_runnable_others_without_a_readable_count_is_zero(text):
    assert runnable_others(3, 0.0, lambda: text) == 0
    assert runnable_others(2, 0.0, lambda: None) == 0


@pytest.fixture
def adaptive(monkeypatch):
    monkeypatch.delenv("PCD_THREADS", raising=False)
    monkeypatch.setenv("PCD_ADAPTIVE_THREADS", "1")


@pytest.mark.parametrize(
    ("cpus", "others", "host", "want"),
    [
        (2, 0, 2, 2),  # quiet: every CPU
        (2, 1, 2, 1),  # one neighbour on two CPUs
        (2, 3, 2, 1),  # never below one
        (16, 2, 16, 14),
        (2, 40, 64, 1),  # a 2-CPU container on a busy 64-CPU host: 40 * 2/64 = 1.25 of ours
        (2, 10, 64, 2),  # 10 * 2/64 = 0.31 of ours: rounds to none
        (1, 5, 1, 1),
    ],
)
def test_request_threads_leaves_the_cpus_that_neighbours_hold(adaptive, cpus, others, host, want):
    assert request_threads(cpus, others, host) == want


def test_request_threads_is_fixed_by_pcd_threads_or_by_turning_it_off(adaptive, monkeypatch):
    assert request_threads(2, 5, 2, env="2") == 2  # the user chose
    monkeypatch.setenv("PCD_ADAPTIVE_THREADS", "0")
    assert request_threads(2, 5, 2, env=None) == 2
    with pytest.raises(InvalidArgumentError, match="PCD_THREADS"):
        request_threads(2, 5, 2, env="-1")


@pytest.fixture
def budget(monkeypatch):
    """`threads.set_thread_budget`, put back after the test."""
    monkeypatch.setattr(threads, "_budget", None)
    monkeypatch.delenv("PCD_DECODE_THREADS", raising=False)
    return threads.set_thread_budget


def _readers():
    """What each pool sizes itself by, when nothing else is asked for."""
    from pcd_tools.engine.kernels import qgemm
    from pcd_tools.engine.passes.workers import ThreadFit

    return {
        "budget": threads.thread_budget(),
        "passes": ThreadFit().pick(),
        "request": request_threads(),
        "decode": threads.decode_threads(),
        "qgemm": qgemm._threads(None),
        "kernels": threads.kernel_threads(),
    }


def test_one_thread_budget_is_what_every_pool_reads(budget, monkeypatch):
    monkeypatch.delenv("PCD_THREADS", raising=False)
    monkeypatch.setenv("PCD_ADAPTIVE_THREADS", "0")
    assert threads.thread_budget() == usable_cpus()
    assert budget(1) == 1
    assert set(_readers().values()) == {1}
    assert budget(3) == 3
    assert set(_readers().values()) == {3}
    monkeypatch.setenv("PCD_DECODE_THREADS", "2")  # the decode pool's own count still wins
    assert threads.decode_threads() == 2
    assert threads.kernel_threads(5) == 5  # as does a kernel call's
    assert budget(None) == usable_cpus()
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(InvalidArgumentError, match="thread budget"):
            budget(bad)


def test_pcd_threads_sets_the_budget_unless_one_is_set(budget, monkeypatch):
    monkeypatch.setenv("PCD_ADAPTIVE_THREADS", "0")
    monkeypatch.setenv("PCD_THREADS", "3")
    assert set(_readers().values()) == {3}
    budget(1)  # a budget set in code (ray's size_threads) is the process's share
    assert set(_readers().values()) == {1}
    budget(None)
    monkeypatch.setenv("PCD_THREADS", "0")
    with pytest.raises(InvalidArgumentError, match="PCD_THREADS='0' is not accepted"):
        threads.thread_budget()


def test_a_budget_set_after_an_engine_is_built_holds_for_its_next_pick(budget, monkeypatch):
    from pcd_tools.engine.passes.workers import ThreadFit

    monkeypatch.delenv("PCD_THREADS", raising=False)
    budget(4)
    fit = ThreadFit(suggest=lambda cpus: cpus)
    assert fit.pick() == 4
    budget(2)
    assert (fit.pick(), fit.budget) == (2, 2)
    monkeypatch.setattr(threads, "request_threads", lambda cpus: cpus - 1)
    fit = ThreadFit()  # request_threads is looked up where it lives, at every pick
    assert fit.pick() == 1 and fit.busy


def test_ray_size_threads_sets_the_engine_budget(budget, monkeypatch):
    from pcd_tools.engine.host import blas
    from pcd_tools.ray.data import size_threads

    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "7")  # put back after the test
    monkeypatch.delenv("PCD_THREADS", raising=False)
    monkeypatch.setenv("PCD_ADAPTIVE_THREADS", "0")
    set_blas: list[int] = []
    monkeypatch.setattr(blas, "set_blas_threads", set_blas.append)
    assert size_threads(1.5) == 1
    assert set(_readers().values()) == {1}
    assert set_blas == [1]
