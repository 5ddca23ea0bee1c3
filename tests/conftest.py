"""Shared test set-up: how the suite compiles (tests/compiling.py: a persistent compilation
cache and faster-compiling XLA flags, because compiling is most of a test's time on 2 cores);
real small filesystems for the disk tests."""
import os
import subprocess
from pathlib import Path

import compiling

compiling.configure_this_process()  # before any test starts JAX's backend

import pytest  # noqa: E402


class SmallDisks:
    """Real small filesystems (tmpfs mounts) for the tests of full and read-only disks."""

    def __init__(self, base: Path):
        self.base, self.mounted = base, []

    def mount(self, options: str = "size=4m") -> Path:
        """A fresh tmpfs with mount ``options``; the test is skipped where none can be mounted."""
        if os.geteuid() != 0:
            pytest.skip("a real small filesystem is a tmpfs mount, which needs root")
        path = self.base / f"disk{len(self.mounted)}"
        path.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                 capture_output=True, text=True)
        if mounted.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
        self.mounted.append(path)
        return path

    @staticmethod
    def fill(disk: Path, leave: int = 0) -> Path:
        """Fill ``disk`` with the file it returns, then give ``leave`` bytes back."""
        filler = disk / "filler"
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(bytes(1 << 16))
            except OSError:
                f.truncate(max(0, f.tell() - leave))
        return filler

    def unmount_all(self) -> None:
        for path in self.mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def small_disks(tmp_path):
    disks = SmallDisks(tmp_path)
    yield disks
    disks.unmount_all()


@pytest.fixture
def registered():
    """``registered(id, factory)``: an environment id of the test's own, for the test's length."""
    from rlhf_jax.envs import register, unregister

    ids = []

    def add(env_id, factory):
        register(env_id, factory)
        ids.append(env_id)

    yield add
    for env_id in ids:
        unregister(env_id)
