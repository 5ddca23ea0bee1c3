"""Where a finished figure-2 cell's policies go: their returns split into the task's parts.

    python -m benchmarks.mujoco_diagnose runs/reproduce/fig2_cpu/reacher/700-labels-<fp> [...] [--episodes N]
    python -m benchmarks.mujoco_diagnose runs/<a train run's directory> [...]

For each cell (a sweep directory of ``benchmarks/reproduce.py --backend cpu``, or the
directory of one ``rlhf-jax train`` run on an ``envpool/`` MuJoCo task) the newest
checkpoint is restored and each seed's policy plays ``--episodes`` whole episodes of the
unmodified task on EnvPool (sampling, as in training). Per seed: the true (Gymnasium v5)
return, the torque cost inside it, the return without it, and the episode length; beside
them the reward model's last accuracy on fresh pairs and its correlation with the oracle's
reward (from ``members.csv``). Printed as a table and written to
``benchmarks/results/mujoco_diagnose.json`` (cells from earlier calls kept).

Why the split: the paper removed the torque costs from the tasks ("torques are not directly
visible to a human supervisor ... so we removed them", appendix A.1); here the oracle does
not see them, but every curve is scored by Gymnasium's reward, which holds them.
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import envpool
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import RESULTS
from rlhf_jax.agents.base import env_step
from rlhf_jax.checkpoints import Checkpoints
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.sweep import GroupProgram, Sweep, device_mesh


def play(training, params, episodes: int, seed: int) -> dict:
    """Each seed's policy (``params`` stacked over seeds) on ``episodes`` copies of the plain task,
    each copy's first whole episode: return, torque cost, length (means over the copies)."""
    config = training.config.env
    env = make(EnvConfig(id=config.id, num_envs=episodes, seed=config.seed + 10_000))
    act = training.agent.make_policy(training.agent_config, env.spec)
    weight = float(getattr(envpool.make_spec(config.name, num_envs=1).config, "ctrl_cost_weight", 0.0))
    steps = env.spec.max_episode_steps + 1

    def one(params, key):
        def step(carry, key):
            env_state, obs, alive, totals = carry
            env_state, timestep, action = env_step(env, env_state, act(params, obs, key))
            counted = alive & ~timestep.action_ignored
            torque = weight * jnp.sum(jnp.square(action), axis=-1)
            totals = totals + jnp.stack([timestep.info["true_reward"], torque, jnp.ones_like(torque)]) * counted
            return (env_state, timestep.obs, alive & ~timestep.info["true_done"], totals), None

        reset_key, key = jax.random.split(key)
        env_state, timestep = env.reset(reset_key)
        carry = (env_state, timestep.obs, jnp.ones((episodes,), bool), jnp.zeros((3, episodes)))
        (_, _, _, totals), _ = jax.lax.scan(step, carry, jax.random.split(key, steps))
        return totals.mean(axis=1)

    rows = []
    seeds = jax.tree.leaves(params)[0].shape[0]
    run = jax.jit(one)
    for s in range(seeds):  # one after another: the pool is not vmapped
        totals = np.asarray(run(jax.tree.map(lambda x: x[s], params), jax.random.PRNGKey(seed + s)))
        rows.append({"true_return": float(totals[0]), "torque_cost": float(totals[1]),
                     "return_without_torque_cost": float(totals[0] + totals[1]), "length": float(totals[2])})
    return rows


def diagnose_run(directory: Path, episodes: int) -> dict:
    """One ``rlhf-jax train`` run: its one seed, as a cell of one."""
    from rlhf_jax.trainer import load_run_config, make_training, restore_latest

    config = load_run_config(directory)
    training = make_training(config)
    _, runner = restore_latest(training, directory)
    params = jax.tree.map(lambda x: x[None], training.policy_params(runner))
    rows = play(training, params, episodes, seed=0)
    rows[0]["seed"] = config.seed
    with open(directory / "metrics.csv") as file:
        last = list(csv.DictReader(file))[-1]
    for key in ("reward_accuracy", "reward_correlation", "episode_return"):
        if last.get(key):
            rows[0][f"last_chunk_{key}"] = float(last[key])
    return {"env_steps": int(runner.env_steps), "seeds": rows}


def diagnose(directory: Path, episodes: int) -> dict:
    if not (directory / "group0").exists():
        return diagnose_run(directory, episodes)
    sweep = Sweep.load(directory)
    program = GroupProgram(sweep.base, sweep.groups[0], device_mesh())
    chunk, state = Checkpoints(directory / "group0", resume_command="").restore(program.abstract_state())
    training = program.training
    rows = play(training, training.policy_params(state), episodes, seed=0)
    last = {}
    for row in sweep.rows():
        if int(row["chunk"]) == chunk:
            last[int(row["seed"])] = row
    for row, seed in zip(rows, sorted(last)):
        row["seed"] = seed
        for key in ("reward_accuracy", "reward_correlation", "episode_return"):
            if key in last[seed]:
                row[f"last_chunk_{key}"] = last[seed][key]
    return {"chunk": chunk, "env_steps": training.steps_per_iteration * training.chunk_iterations * (chunk + 1),
            "seeds": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="+", help="sweep directories of finished cells")
    parser.add_argument("--episodes", type=int, default=8)
    args = parser.parse_args()
    path = RESULTS / "mujoco_diagnose.json"
    result = json.loads(path.read_text()) if path.exists() else {"cells": {}}
    for directory in map(Path, args.cells):
        key = f"{directory.parent.name}/{directory.name}"
        result["cells"][key] = diagnose(directory, args.episodes)
        print(f"{key}:", flush=True)
        for row in result["cells"][key]["seeds"]:
            print("   " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
        path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
