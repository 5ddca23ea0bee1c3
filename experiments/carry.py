"""Carrying runs begun but not finished to another machine, through the repository.

A run longer than a machine is kept (Pong's, hours each) goes on elsewhere from one archive:
:func:`pack_unfinished` puts each unfinished run's directory into it with only its newest
checkpoint (``checkpoints/<chunk>``, the highest whole one; about 10 MB for the Nature CNN and
its optimiser), and :func:`unpack_unfinished` puts back the runs the machine lacks or holds
only at an older checkpoint, so that the experiment's own command goes on from the newest
(its wall seconds and metrics carried with it). A machine's run as new as the archive's, or
newer, is left as it is.
"""
from __future__ import annotations

import tarfile
from pathlib import Path

from rlhf_jax.errors import ConfigError
from rlhf_jax.files import write_atomically

CHECKPOINTS = "checkpoints"


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The run's newest whole checkpoint: orbax gives one its bare number only once it is written."""
    folder = run_dir / CHECKPOINTS
    chunks = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    return folder / str(max(chunks)) if chunks else None


def pack_unfinished(run_dirs: list[Path], runs_dir: Path, archive: Path) -> list[Path]:
    """Write ``archive`` (gzip tar, paths relative to ``runs_dir``) with each of ``run_dirs``
    that has a checkpoint: its files and its newest checkpoint, the older ones left out.
    Returns the runs packed; with none, ``archive`` is removed rather than left stale."""
    newest = {run_dir: newest_checkpoint(run_dir) for run_dir in run_dirs}
    packed = [run_dir for run_dir in run_dirs if newest[run_dir] is not None]
    if not packed:
        archive.unlink(missing_ok=True)
        return []

    def write(partial: Path) -> None:
        with tarfile.open(partial, "w:gz") as tar:
            for run_dir in packed:
                name = run_dir.relative_to(runs_dir)
                for path in sorted(run_dir.iterdir()):
                    if path.name != CHECKPOINTS:
                        tar.add(path, name / path.name)
                tar.add(newest[run_dir], name / CHECKPOINTS / newest[run_dir].name)

    write_atomically(archive, write)  # a stop mid-write leaves the old archive whole
    return packed


def chunk_number(path: Path) -> int:
    """The chunk a checkpoint folder holds (-1 for none): its bare number."""
    return int(path.name) if path is not None and path.name.isdigit() else -1


def carried_chunk(members: list[tarfile.TarInfo], run: Path) -> int:
    """The newest chunk the archive holds of ``run`` (-1 for none)."""
    inside = [Path(m.name).relative_to(run).parts for m in members if run in Path(m.name).parents]
    return max((int(parts[1]) for parts in inside if len(parts) > 1 and parts[0] == CHECKPOINTS
                and parts[1].isdigit()), default=-1)


def unpack_unfinished(archive: Path, runs_dir: Path) -> list[Path]:
    """Put back into ``runs_dir`` each run of ``archive`` that it lacks (no ``config.yaml``
    there) or holds at an older checkpoint than the archive's (a machine that ran it before
    another machine took it further): its files replaced by the archive's, its checkpoints
    joined by the newer one. Returns those run directories. A member that would land outside
    ``runs_dir`` (an absolute path, ``..``, a link out) is refused with a :class:`ConfigError`."""
    if not archive.exists():
        return []
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        try:  # every member checked before any is read or written
            for member in members:
                tarfile.data_filter(member, str(runs_dir))
        except tarfile.FilterError as error:
            raise ConfigError(f"{archive}: {error}; nothing of it is used") from None
        runs = {Path(m.name).parent for m in members if Path(m.name).name == "config.yaml"}
        behind = {run for run in runs if not (runs_dir / run / "config.yaml").exists()
                  or chunk_number(newest_checkpoint(runs_dir / run)) < carried_chunk(members, run)}
        wanted = [m for m in members if any(run in Path(m.name).parents for run in behind)]
        tar.extractall(runs_dir, members=wanted, filter="data")
    return sorted(runs_dir / run for run in behind)
