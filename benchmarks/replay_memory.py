"""Device memory of a 1M-transition Atari replay and of 3,000 Atari preference labels, computed
with ``jax.eval_shape`` (nothing is allocated).

    python -m benchmarks.replay_memory

* ``atari_replay_1m_gib``: our memory, each 84x84 frame stored once (target <= 8);
* ``stacked_obs_gib``: the same storing each 4-frame stack whole (next observation still shared);
* ``stacked_obs_and_next_gib``: the naive layout storing both s and s' as whole stacks;
* ``atari_labels_3000_gib``: the label database D at the paper's Atari capacity (3,000 labels,
  appendix A.2; 25-step segments, 3 ensemble members), each frame of a segment stored once,
  the clip's own k = 25 frames (the default; target <= 1);
* ``atari_labels_3000_with_frames_before_clip_gib``: the same keeping the 3 frames before
  each clip that its first stacks reach back to (``preferences.frames_before_clip``), k + 3 = 28;
* ``atari_labels_3000_stacked_gib``: the same storing every step's 4-frame stack whole (as before).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import Headline, Target, ratio, write_result
from rlhf_jax import replay
from rlhf_jax.envs.core import Discrete, EnvSpec
from rlhf_jax.reward.data import empty_labels, labels_nbytes

CAPACITY = 1_000_000
NUM_ENVS = 16
ATARI = (84, 84, 4)
GIB = 2**30
LABELS, SEGMENT, MEMBERS = 3_000, 25, 3
PONG = EnvSpec(id="envpool/Pong-v5", backend="envpool-atari", num_envs=NUM_ENVS, observation_shape=ATARI,
               observation_dtype="uint8", action_space=Discrete(6), fps=15.0, max_episode_steps=27_000)


def label_bytes() -> tuple[int, int, int]:
    """Bytes of the label database as it is (each clip's own frames, once), with the frames
    before each clip, and as it was (every stack whole)."""
    ours = labels_nbytes(PONG, LABELS, SEGMENT, MEMBERS)
    with_history = labels_nbytes(PONG, LABELS, SEGMENT, MEMBERS, frames_before_clip=True)
    shapes = jax.eval_shape(lambda: empty_labels(PONG, LABELS, SEGMENT, MEMBERS))
    frames = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in (shapes.frames, shapes.restart))
    stacks = LABELS * 2 * SEGMENT * int(np.prod(ATARI))  # uint8 [C, 2, k, 84, 84, 4]
    return ours, with_history, ours - frames + stacks


def main() -> None:
    ours = replay.nbytes(CAPACITY, NUM_ENVS, ATARI, jnp.uint8, stack=4)
    stacked = replay.nbytes(CAPACITY, NUM_ENVS, ATARI, jnp.uint8, stack=1)
    stack_bytes = CAPACITY * 84 * 84 * 4
    labels, labels_with_history, labels_stacked = label_bytes()
    write_result("replay_memory", {
        "capacity": CAPACITY,
        "num_envs": NUM_ENVS,
        "atari_replay_1m_bytes": ours,
        "atari_replay_1m_gib": round(ours / GIB, 3),
        "atari_replay_1m_target_gib": 8,
        "stacked_obs_gib": round(stacked / GIB, 3),
        "stacked_obs_and_next_gib": round((stacked + stack_bytes) / GIB, 3),
        "saving_over_stacked": round(stacked / ours, 2),
        "atari_labels_3000_bytes": labels,
        "atari_labels_3000_gib": round(labels / GIB, 3),
        "atari_labels_3000_target_gib": 1,
        "atari_labels_3000_with_frames_before_clip_gib": round(labels_with_history / GIB, 3),
        "atari_labels_3000_stacked_gib": round(labels_stacked / GIB, 3),
        "labels_saving_over_stacked": round(labels_stacked / labels, 2),
    }, headline=headline)


def headline(result: dict) -> list[Headline]:
    """The report's rows: our replay's and label database's memory against the naive layouts',
    each with its target."""
    ours, naive = result["atari_replay_1m_gib"], result["stacked_obs_and_next_gib"]
    labels, labels_naive = result["atari_labels_3000_gib"], result["atari_labels_3000_stacked_gib"]
    return [Headline("Atari replay of 1M transitions, GiB (peer: s and s' stored as whole 4-frame stacks)",
                     ours, naive, ratio(ours, naive),
                     Target.on(result, "atari_replay_1m_gib", "<=", result["atari_replay_1m_target_gib"])),
            Headline("3,000 Atari preference labels, GiB (peer: every step's 4-frame stack stored whole)",
                     labels, labels_naive, ratio(labels, labels_naive),
                     Target.on(result, "atari_labels_3000_gib", "<=", result["atari_labels_3000_target_gib"]))]


if __name__ == "__main__":
    main()
