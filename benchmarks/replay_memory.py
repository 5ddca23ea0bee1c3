"""Device memory of a 1M-transition Atari replay, computed with ``jax.eval_shape`` (nothing is allocated).

    python -m benchmarks.replay_memory

* ``atari_replay_1m_gib``: our memory, each 84x84 frame stored once (target <= 8);
* ``stacked_obs_gib``: the same storing each 4-frame stack whole (next observation still shared);
* ``stacked_obs_and_next_gib``: the naive layout storing both s and s' as whole stacks.
"""
from __future__ import annotations

import jax.numpy as jnp

from benchmarks.common import Headline, Target, ratio, write_result
from rlhf_jax import replay

CAPACITY = 1_000_000
NUM_ENVS = 16
ATARI = (84, 84, 4)
GIB = 2**30


def main() -> None:
    ours = replay.nbytes(CAPACITY, NUM_ENVS, ATARI, jnp.uint8, stack=4)
    stacked = replay.nbytes(CAPACITY, NUM_ENVS, ATARI, jnp.uint8, stack=1)
    stack_bytes = CAPACITY * 84 * 84 * 4
    write_result("replay_memory", {
        "capacity": CAPACITY,
        "num_envs": NUM_ENVS,
        "atari_replay_1m_bytes": ours,
        "atari_replay_1m_gib": round(ours / GIB, 3),
        "atari_replay_1m_target_gib": 8,
        "stacked_obs_gib": round(stacked / GIB, 3),
        "stacked_obs_and_next_gib": round((stacked + stack_bytes) / GIB, 3),
        "saving_over_stacked": round(stacked / ours, 2),
    }, headline=headline)


def headline(result: dict) -> list[Headline]:
    """The report's row: our replay's memory against the naive layout's, with its target."""
    ours, naive = result["atari_replay_1m_gib"], result["stacked_obs_and_next_gib"]
    return [Headline("Atari replay of 1M transitions, GiB (peer: s and s' stored as whole 4-frame stacks)",
                     ours, naive, ratio(ours, naive),
                     Target.on(result, "atari_replay_1m_gib", "<=", result["atari_replay_1m_target_gib"]))]


if __name__ == "__main__":
    main()
