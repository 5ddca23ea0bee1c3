"""Bytes on disk of a label dataset (``rlhf-jax labels export``) of 500 CartPole and of 500 Pong labels.

    python -m benchmarks.label_dataset_size

The segments are real environment steps, played by a uniformly random policy through the
library's own environments (Pong: EnvPool's Atari with the paper's preprocessing, stacks of
4 84x84 frames, 25-step segments; CartPole: the built-in experiment's environment, 75-step
segments), paired at random and answered by the synthetic oracle. A trained policy's frames
would differ little in how they compress: Pong's screen is mostly the same background
whatever the paddles do. ``pong_noise_*`` is the worst case: the same labels with uniformly
random pixels, which nothing compresses.

Per environment the result gives the dataset directory's bytes (Parquet files and card), its
bytes per label, the rows' bytes before compression, the bytes of the same labels in the run
format ``labels.npz`` (whole stacks, ``np.savez_compressed``), and the seconds to write and to
read the dataset back. The report's row: the Pong dataset's MiB against ``labels.npz``'s.
"""
from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import Headline, enable_compilation_cache, ratio, write_result
from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, build, to_dict
from rlhf_jax.config_base import dump_yaml
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax import label_datasets
from rlhf_jax.replay import frame_stack
from rlhf_jax.reward.data import frames_on_host

LABELS = 500
MIB = 2**20
TASKS = {
    # name: (environment, steps per segment, copies stepped at once)
    "cartpole": (EnvConfig(**{**DEFAULT_EXPERIMENT["env"], "num_envs": 100}), 75, 100),
    "pong": (EnvConfig(id="envpool/Pong-v5", num_envs=8), 25, 8),
}


def play(env_config: EnvConfig, steps: int, seed: int = 0):
    """``steps`` steps of every copy under a uniformly random policy: ``obs [T, N, ...]`` (what
    each step's action was taken on), ``action [T, N]``, the oracle's ``reward [T, N]``."""
    env = make(env_config)
    actions = env.spec.action_space.n

    def step(carry, key):
        state, obs = carry
        action = jax.random.randint(key, (env.num_envs,), 0, actions)
        state, timestep = env.step(state, action)
        return (state, timestep.obs), (obs, action.astype(jnp.int32), timestep.reward)

    def run(key):
        reset_key, steps_key = jax.random.split(key)
        state, timestep = env.reset(reset_key)
        return jax.lax.scan(step, (state, timestep.obs), jax.random.split(steps_key, steps))[1]

    return env.spec, jax.device_get(jax.jit(run)(jax.random.PRNGKey(seed)))


def labels_of(env_config: EnvConfig, length: int, copies: int, seed: int = 0) -> label_datasets.LabelDataset:
    """500 labels of random pairs of ``length``-step segments cut from random play, as a run's
    labels would be exported (the oracle's answers, every member's held-out flags)."""
    segments = 2 * LABELS
    spec, (obs, action, reward) = play(env_config, math.ceil(segments / copies) * length, seed)
    cut = lambda x: np.swapaxes(x, 0, 1).reshape(-1, length, *x.shape[2:])[:segments]  # [S, k, ...] per copy
    obs, action, reward = cut(obs), cut(action), cut(reward)
    rng = np.random.default_rng(seed)
    pairs = rng.permutation(segments).reshape(LABELS, 2)
    returns = reward.sum(-1)[pairs].astype(np.float32)
    mu = np.where(returns[:, 0] > returns[:, 1], 1.0, np.where(returns[:, 0] < returns[:, 1], 0.0, 0.5))
    stack = frame_stack(spec)
    frames, restart = frames_on_host(obs[pairs], stack)
    rows = label_datasets.LabelRows(frames, restart, action[pairs], mu.astype(np.float32), returns,
                                   rng.random((LABELS, 3)) < 1 / math.e, None)
    config = build(ExperimentConfig, {**DEFAULT_EXPERIMENT, "env": to_dict(env_config)})
    info = label_datasets.DatasetInfo(
        kind="compare", env=env_config, rows=LABELS, segment_length=length, stack=stack,
        frame_shape=tuple(frames.shape[3:]), observation_dtype=str(obs.dtype), action_shape=(),
        action_dtype="int32", members=3, labeler="synthetic", source="random play (benchmarks.label_dataset_size)",
        run_config=dump_yaml(to_dict(config)))
    return label_datasets.LabelDataset(info, rows, label_datasets.Provenance.unknown(LABELS, "oracle"))


def with_noise(dataset: label_datasets.LabelDataset) -> label_datasets.LabelDataset:
    """The same labels with every frame's pixels uniformly random: the worst case of compression."""
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, dataset.rows.frames.shape, np.uint8)
    return dataset._replace(rows=dataset.rows._replace(frames=frames))


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(name: str, work: Path, noise: bool = False) -> dict:
    env_config, length, copies = TASKS[name]
    start = time.perf_counter()
    dataset = labels_of(env_config, length, copies)
    played = time.perf_counter() - start
    if noise:
        dataset, name = with_noise(dataset), f"{name}_noise"
    out = work / name
    start = time.perf_counter()
    label_datasets.write(dataset, out)
    written = time.perf_counter() - start
    start = time.perf_counter()
    back = label_datasets.read(out)
    read = time.perf_counter() - start
    np.testing.assert_array_equal(back.rows.frames, dataset.rows.frames)  # what was measured is what was written
    npz = label_datasets.write_labels_npz(dataset, work / f"{name}.npz")
    rows_bytes = sum(a.nbytes for a in dataset.rows if a is not None)
    total, parquet = directory_bytes(out), label_datasets.parquet_bytes(out)
    info = dataset.info
    result = {
        "env": info.env.id, "labels": LABELS, "segment_length": length,
        "observation": f"{info.observation_dtype}{list(info.observation_shape)}",
        "frames_per_segment": info.frames_per_segment,
        "dataset_bytes": total, "dataset_mib": round(total / MIB, 3),
        "parquet_bytes": parquet, "card_bytes": (out / label_datasets.CARD_FILE).stat().st_size,
        "bytes_per_label": round(total / LABELS),
        "rows_bytes_uncompressed": rows_bytes, "rows_mib_uncompressed": round(rows_bytes / MIB, 3),
        "compression_ratio": round(rows_bytes / parquet, 2),
        "labels_npz_bytes": npz.stat().st_size, "labels_npz_mib": round(npz.stat().st_size / MIB, 3),
        "write_seconds": round(written, 2), "read_seconds": round(read, 2), "play_seconds": round(played, 2),
    }
    print(f"{name}: {result['dataset_mib']} MiB ({result['bytes_per_label']} bytes a label; rows "
          f"{result['rows_mib_uncompressed']} MiB uncompressed; labels.npz {result['labels_npz_mib']} MiB)", flush=True)
    return result


def main() -> None:
    enable_compilation_cache()
    work = Path(tempfile.mkdtemp(prefix="label_dataset_size-"))
    try:
        tasks = {name: measure(name, work) for name in TASKS}
        tasks["pong_noise"] = measure("pong", work, noise=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_result("label_dataset_size", {
        "labels": LABELS,
        "policy": "uniformly random (real environment steps; pairs at random; the synthetic oracle's answers)",
        "zstd_level": label_datasets.ZSTD_LEVEL,
        **{f"{name}_{key}": value for name, result in tasks.items() for key, value in result.items()},
    }, headline=headline)


def headline(result: dict) -> list[Headline]:
    """The report's row: 500 Pong labels as a dataset against the same labels in ``labels.npz``."""
    ours, peer = result.get("pong_dataset_mib"), result.get("pong_labels_npz_mib")
    return [Headline("500 Pong preference labels on disk, MiB: Parquet dataset, frames once "
                     "(peer: the run's labels.npz, whole 4-frame stacks)", ours, peer, ratio(ours, peer))]


if __name__ == "__main__":
    main()
