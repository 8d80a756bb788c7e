"""Where the warm workers run: inside bubblewrap when it is installed, else with a loud warning.

In the bubblewrap sandbox a worker sees the system directories and the Python
installation read-only, and nothing of the course (no solutions/, no gradebook, no other
submissions) nor of this package's checks and grader (only `VISIBLE`); it has no network,
its own process, IPC and hostname namespaces, and two small private tmpfs: one for its own
state, one for its notebooks' scratch directories.
Where the machine has an NVIDIA GPU that torch can use, it is passed in: its device nodes,
and read-only the directories of its driver libraries outside the system directories
(`gpu`); nothing else is widened.
Without bubblewrap (macOS, Colab, or where user namespaces are disabled) workers run as
ordinary processes: every resource limit and the process-per-notebook model still hold,
and Landlock still confines files and TCP where the kernel has it, but the namespaces
are missing.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import autograder

from . import landlock
from .limits import WorkerConfig

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "localtime", "fonts",
       "alternatives")
STATE, SCRATCH = "/var/worker", "/tmp"  # inside the sandbox
SCRATCH_BYTES = 512 << 20  # all scratch directories of one worker together
# As root, worker k runs its notebooks as uid/gid FIRST_UID + k: unprivileged, and its own,
# so that one notebook's processes never count against another's process limit.
FIRST_UID = 65500
INSTALL_HINT = "Debian/Ubuntu: sudo apt-get install bubblewrap"


@dataclass(frozen=True)
class Isolation:
    """What this machine offers for running student code."""

    bubblewrap: str | None  # path of bwrap, None where workers run without a sandbox
    landlock: int  # the kernel's Landlock ABI, 0 if none
    why_not: str = ""  # why there is no sandbox
    gpu: str | None = None  # the GPU notebooks get (its name), None for none

    @property
    def root(self) -> bool:
        return os.geteuid() == 0

    def summary(self) -> str:
        where = "bubblewrap sandbox" if self.bubblewrap else "NO SANDBOX"
        landlock_text = f"Landlock ABI {self.landlock}" if self.landlock else "no Landlock"
        users = ", notebooks run as unprivileged users" if self.root and self.bubblewrap else ""
        return f"{where}, {landlock_text}{users}" + (f", GPU passed in ({self.gpu})" if self.gpu else "")

    def warnings(self) -> list[str]:
        if self.bubblewrap:
            return []
        missing = ["no network isolation", "student code can see this machine's files that your user can read, "
                   "the checks' references and the course's solutions among them"]
        if self.landlock:
            missing[1] = "Landlock still blocks the course files and the checks, but not UDP or other machine state"
        missing.append("no process-count limit")
        return [
            f"ISOLATION IS REDUCED: {self.why_not}. Student code runs without the bubblewrap sandbox: "
            + "; ".join(missing) + f". Install bubblewrap to grade untrusted code ({INSTALL_HINT})."
        ]


# What of this package student code may see: the student side, and the code that runs it.
VISIBLE = {"__init__.py", "student", "runner", "isolation"}


def hidden_paths() -> list[str]:
    """Everything else of this package — the checks with their references, the grader and
    the tools — which student code never sees, even where the Python installation that
    holds this package is readable."""
    package = Path(autograder.__file__).resolve().parent
    return sorted(str(p) for p in package.iterdir() if p.name not in VISIBLE)


def without(paths: list[str], hidden: list[str]) -> list[str]:
    """`paths`, each one that holds a hidden path replaced by its other entries (Landlock
    can only allow, never deny beneath what it allows)."""
    found = []
    for path in paths:
        inside = [h for h in hidden if Path(h).is_relative_to(path)]
        if not inside:
            found.append(path)
        elif path not in inside:
            found += without(sorted(str(p) for p in Path(path).iterdir()), inside)
    return found


def readable_paths(course_root: Path) -> list[str]:
    """The Python installation and this package, never a directory that holds the course."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values(),
                  str(Path(autograder.__file__).parent)}
    course = course_root.resolve()
    found: list[str] = []
    for path in sorted({os.path.realpath(p) for p in candidates if os.path.isdir(p)}):
        if course == Path(path) or course.is_relative_to(path):
            continue  # it holds the course: leave it out
        if not any(Path(path).is_relative_to(kept) for kept in found):
            found.append(path)
    return found


def _system_arguments() -> list[str]:
    args = []
    for path in SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--perms", "0755", "--dir", "/etc"]  # else private to root: the notebooks' user could not read
    for name in ETC:                               # fonts.conf, and dot would complain on every graph
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def gpu_devices() -> list[str]:
    """The NVIDIA device nodes (/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, ...)."""
    return sorted(glob.glob("/dev/nvidia*"))


def driver_directories() -> list[str]:
    """Directories of the NVIDIA driver's libraries (libcuda, libnvidia-*) that the system
    directories do not hold already (a container may mount them elsewhere)."""
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = {os.path.dirname(os.path.realpath(line.split(" => ")[-1].strip())) for line in cache.splitlines()
             if " => " in line and line.strip().startswith(("libcuda.", "libnvidia-"))}
    inside = [os.path.realpath(p) for p in SYSTEM if os.path.exists(p)]
    return sorted(d for d in found if os.path.isdir(d) and not any(Path(d).is_relative_to(s) for s in inside))


def find_gpu() -> tuple[str | None, str]:
    """(the name of the GPU that notebooks get, "") or (None, why there is none)."""
    if not gpu_devices():
        return None, "no NVIDIA device (/dev/nvidia*) on this machine"
    import torch

    if not torch.cuda.is_available():
        return None, "torch finds no CUDA device here (CUDA_VISIBLE_DEVICES, or a torch built without CUDA)"
    return torch.cuda.get_device_name(), ""


def bubblewrap_arguments(bwrap: str, readable: list[str], gpu: bool = False) -> list[str]:
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--clearenv"]
    if os.geteuid() == 0:  # the worker drops each child to nobody, and must be able to end it
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_KILL"]
    else:
        args += ["--unshare-user"]
    args += _system_arguments() + ["--proc", "/proc", "--dev", "/dev", "--ro-bind-try", "/sys", "/sys"]
    if gpu:  # after the fresh /dev, which would hide them; the driver needs them read-write (ioctl)
        for device in gpu_devices():
            args += ["--dev-bind", device, device]
        for directory in driver_directories():
            args += ["--ro-bind", directory, directory]
    # The empty file systems first: Python installed under /tmp (a CI checkout) is bound on top of them.
    args += ["--tmpfs", STATE, "--size", str(SCRATCH_BYTES), "--perms", "1777", "--tmpfs", SCRATCH]
    parents = sorted({str(p) for path in readable for p in Path(path).parents} - {"/", STATE, SCRATCH})
    for parent in parents:  # bubblewrap would create them private (0700): nobody could pass
        args += ["--perms", "0755", "--dir", parent]
    for path in readable:
        args += ["--ro-bind", path, path]
    for path in hidden_paths():  # masked: an empty directory, an empty file
        if any(Path(path).is_relative_to(kept) for kept in readable):
            args += ["--tmpfs", path, "--remount-ro", path] if os.path.isdir(path) else ["--ro-bind", os.devnull, path]
    return args + ["--chdir", STATE]


TRIALS = 3


def detect(use_sandbox: bool = True, course_root: Path = Path.cwd()) -> Isolation:
    """What this machine offers; a GPU that the grader's torch can use goes to the notebooks
    too (the checks send them CUDA tensors)."""
    abi = landlock.abi()
    gpu, _ = find_gpu()
    if not use_sandbox:
        return Isolation(None, abi, "--no-sandbox was given", gpu)
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Isolation(None, abi, "bubblewrap (bwrap) is not installed", gpu)
    command = [*bubblewrap_arguments(bwrap, readable_paths(course_root), gpu is not None), "--", sys.executable, "-I",
               "-c", "pass"]
    for attempt in range(TRIALS):  # a busy machine may fail one (e.g. namespaces still being freed)
        trial = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if trial.returncode == 0:
            return Isolation(bwrap, abi, gpu=gpu)
        time.sleep(0.5 * (attempt + 1))
    return Isolation(None, abi, f"bubblewrap does not work here ({trial.stderr.strip() or trial.returncode})", gpu)


@dataclass
class Launch:
    """How to start one worker: command, environment and the configuration it is sent."""

    argv: list[str]
    env: dict[str, str]
    config: WorkerConfig


def launch(isolation: Isolation, course_root: Path, runtime: Path, control_fd: int, slot: int) -> Launch:
    """Worker number `slot`; `runtime` is a private directory of the grader (used only without a sandbox)."""
    readable = readable_paths(course_root)
    sandboxed = isolation.bubblewrap is not None
    if sandboxed:
        state, scratch = STATE, SCRATCH
    else:
        state, scratch = str(runtime / "state"), str(runtime / "scratch")
        os.makedirs(state)
        os.makedirs(scratch)
    env = {
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": state, "MPLCONFIGDIR": os.path.join(state, "matplotlib"), "TMPDIR": state,
        "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "NBGRADER_EXECUTION": "autograde",  # as stock nbgrader tells notebooks they are being graded
        **{k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")},  # CPU workarounds of this machine
    }
    command = [sys.executable, "-I", "-B", "-m", "autograder.runner.zygote", str(control_fd)]
    if isolation.bubblewrap is not None:  # sandboxed
        prefix = bubblewrap_arguments(isolation.bubblewrap, readable, isolation.gpu is not None)
        for name, value in env.items():
            prefix += ["--setenv", name, value]
        command = [*prefix, "--", *command]
    config = WorkerConfig(
        sandboxed=sandboxed,
        scratch=scratch,
        readable=[*without(readable, hidden_paths()), *(p for p in SYSTEM if os.path.exists(p)), "/etc",
                  *(driver_directories() if isolation.gpu else [])],
        limit_processes=sandboxed,
        uid=FIRST_UID + slot if sandboxed and isolation.root else None,
        gpu=isolation.gpu is not None,
    )
    return Launch(command, env, config)


def runtime_directory() -> Path:
    return Path(tempfile.mkdtemp(prefix="autograder-"))
