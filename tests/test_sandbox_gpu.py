"""A GPU goes into the grading sandbox when there is one: its device nodes and, read-only, its
driver libraries; nothing else is widened. `--gpu` without one is refused in one line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autograder.isolation import sandbox

NODES = ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """This machine, with NVIDIA device nodes and a driver directory outside the system's."""
    driver = tmp_path / "nvidia" / "lib64"
    monkeypatch.setattr(sandbox, "gpu_devices", lambda: NODES)
    monkeypatch.setattr(sandbox, "driver_directories", lambda: [str(driver)])
    return str(driver)


def test_a_gpu_adds_its_device_nodes_after_the_fresh_dev_and_its_driver_read_only(fake_gpu):
    without = sandbox.bubblewrap_arguments("bwrap", ["/opt/python"])
    with_gpu = sandbox.bubblewrap_arguments("bwrap", ["/opt/python"], gpu=True)
    assert not [a for a in without if "nvidia" in a]
    added = [arg for node in NODES for arg in ("--dev-bind", node, node)] + ["--ro-bind", fake_gpu, fake_gpu]
    start = with_gpu.index("--dev-bind")
    assert with_gpu[start:start + len(added)] == added  # and nothing else:
    assert with_gpu[:start] + with_gpu[start + len(added):] == without
    assert start > with_gpu.index("--dev")  # a fresh /dev would hide them


def test_a_worker_is_told_of_the_gpu_and_may_read_its_driver(fake_gpu, tmp_path):
    isolation = sandbox.Isolation("/usr/bin/bwrap", 0, gpu="NVIDIA H100")
    launch = sandbox.launch(isolation, tmp_path, tmp_path, 3, 0)
    assert launch.config.gpu and fake_gpu in launch.config.readable
    assert ["--dev-bind", "/dev/nvidia0", "/dev/nvidia0"] == launch.argv[launch.argv.index("/dev/nvidia0") - 1:][:3]
    assert "GPU passed in (NVIDIA H100)" in isolation.summary()
    plain = sandbox.launch(sandbox.Isolation("/usr/bin/bwrap", 0), tmp_path, tmp_path, 3, 0)
    assert not plain.config.gpu and "/dev/nvidia0" not in plain.argv and fake_gpu not in plain.config.readable


def test_driver_directories_are_those_outside_the_system_directories(monkeypatch, tmp_path):
    (tmp_path / "lib64").mkdir()
    cache = (f"\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
             f"\tlibnvidia-ml.so.1 (libc6,x86-64) => {tmp_path}/lib64/libnvidia-ml.so.1\n"
             f"\tlibz.so.1 (libc6,x86-64) => /opt/other/libz.so.1\n")
    monkeypatch.setattr(sandbox.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, cache, ""))
    assert sandbox.driver_directories() == [str(tmp_path / "lib64")]


def test_no_gpu_is_found_without_device_nodes_or_without_cuda(monkeypatch):
    monkeypatch.setattr(sandbox, "gpu_devices", lambda: [])
    assert sandbox.find_gpu() == (None, "no NVIDIA device (/dev/nvidia*) on this machine")
    monkeypatch.setattr(sandbox, "gpu_devices", lambda: NODES)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    name, why = sandbox.find_gpu()
    assert name is None and "torch finds no CUDA device" in why


@pytest.mark.skipif(sandbox.find_gpu()[0] is not None, reason="this machine has a GPU")
def test_grade_gpu_without_a_gpu_is_refused_in_one_line(tmp_path):
    autograder = Path(sys.executable).with_name("autograder")
    done = subprocess.run([str(autograder), "grade", "--gpu"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [f"error: --gpu was given, but {sandbox.find_gpu()[1]}"]
