"""Saving and restoring a run's whole state with orbax-checkpoint, with messages a user can act on."""
from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp

from rlhf_jax.errors import ConfigError


class Checkpoints:
    """The ``checkpoints/`` folder of a run: numbered by chunk, the newest few kept."""

    def __init__(self, run_dir: Path, keep: int = 2):
        self.directory = Path(run_dir).resolve() / "checkpoints"
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, chunk: int, state) -> None:
        self._manager.save(chunk, args=ocp.args.StandardSave(state))
        self._manager.wait_until_finished()

    def latest(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, like):
        """Restore the newest checkpoint into a pytree shaped like ``like`` (arrays or ShapeDtypeStructs)."""
        chunk = self.latest()
        if chunk is None:
            raise ConfigError(f"no checkpoint in {self.directory}: nothing to resume")
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), like)
        try:
            return chunk, self._manager.restore(chunk, args=ocp.args.StandardRestore(abstract))
        except Exception as error:  # orbax raises many kinds; all mean the same to the user
            raise ConfigError(
                f"checkpoint {self.directory / str(chunk)} cannot be restored (corrupt, or written by a "
                f"config with other shapes): {type(error).__name__}: {str(error).splitlines()[0][:300]}"
            ) from None

    def close(self) -> None:
        self._manager.close()
