"""Where a finished figure-2 cell's policies go: their returns split into the task's parts.

    python -m experiments.mujoco_diagnose runs/reproduce/fig2_cpu/reacher/700-labels-<fp> [...] [--episodes N]
    python -m experiments.mujoco_diagnose runs/<a train run's directory> [...]
    python -m experiments.mujoco_diagnose runs/reproduce/fig2_cpu/hopper/700-labels-<fp> --against <another cell>

For each cell (a sweep directory of ``experiments/reproduce.py --backend cpu``, or the
directory of one ``rlhf-jax train`` run on an ``envpool/`` MuJoCo task) the newest
checkpoint is restored and each seed's policy plays ``--episodes`` whole episodes of the
unmodified task on EnvPool (sampling, as in training). Per seed: the true (Gymnasium v5)
return, the torque cost inside it, the return without it, and the episode length; beside
them the reward model's last accuracy on fresh pairs and its correlation with the oracle's
reward (from ``members.csv``). Printed as a table and written to
``experiments/results/mujoco_diagnose.json`` (cells from earlier calls kept).

With ``--against OTHER`` (another cell's sweep directory: RL, TRPO on the oracle, or labels),
every policy of both cells also plays the cell's own training task (its fixed-length
episodes, ends hidden) on ``--episodes`` copies, and each seed's r̂ judges pairs of clips,
one of its own policy's against one of OTHER's: how often the oracle prefers OTHER's clip and
how often r̂ does, and r̂'s and the oracle's mean per step on each side's healthy and unhealthy
steps, each in its own standard deviation (:func:`by_health`). Per policy: the oracle's reward
per step, the share of unhealthy steps and the share of drawn action components outside the
bounds (which the environment clips).
This asks whether a stuck seed's r̂ knows that another policy's play is better, and whether
the oracle the labels come from tells the two apart at all.

Why the split: the paper removed the torque costs from the tasks ("torques are not directly
visible to a human supervisor ... so we removed them", appendix A.1); here the oracle does
not see them, but every curve is scored by Gymnasium's reward, which holds them.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
from pathlib import Path

import envpool
import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import RESULTS
from rlhf_jax import evaluation
from rlhf_jax.agents.base import env_step, rollout_rewards
from rlhf_jax.envs.core import clip_action
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.sweep import GroupProgram, Sweep, member_config


def one_seed(tree, s: int):
    """Seed ``s``'s part of ``tree``, a cell's state or parameters stacked over its seeds."""
    return jax.tree.map(lambda x: x[s], tree)


def play(driver, params, episodes: int, seed: int) -> dict:
    """Each seed's policy (``params`` stacked over seeds) on ``episodes`` copies of the plain task,
    each copy's first whole episode: return, torque cost, length (means over the copies)."""
    config = driver.config.env
    env = make(EnvConfig(id=config.id, num_envs=episodes, seed=config.seed + 10_000))
    act = driver.agent.make_policy(driver.agent_config, env.spec)
    weight = float(getattr(envpool.make_spec(config.name, num_envs=1).config, "ctrl_cost_weight", 0.0))
    steps = env.spec.max_episode_steps + 1

    def one(params, key):
        def step(carry, key):
            env_state, obs, alive, totals = carry
            action = clip_action(env.spec.action_space, act(params, obs, key))  # the torques the robot gets
            env_state, timestep = env_step(env, env_state, action)
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
        totals = np.asarray(run(one_seed(params, s), jax.random.PRNGKey(seed + s)))
        rows.append({"true_return": float(totals[0]), "torque_cost": float(totals[1]),
                     "return_without_torque_cost": float(totals[0] + totals[1]), "length": float(totals[2])})
    return rows


def diagnose_run(directory: Path, episodes: int) -> dict:
    """One ``rlhf-jax train`` run: its one seed, as a cell of one."""
    from rlhf_jax.driver import Driver
    from rlhf_jax.run_dir import load_run_config

    config = load_run_config(directory)
    driver = Driver(config)
    _, runner = driver.restore_latest(directory)
    params = jax.tree.map(lambda x: x[None], driver.policy_params(runner))
    rows = play(driver, params, episodes, seed=0)
    rows[0]["seed"] = config.seed
    with open(directory / "metrics.csv") as file:
        last = list(csv.DictReader(file))[-1]
    for key in ("reward_accuracy", "reward_correlation", "episode_return"):
        if last.get(key):
            rows[0][f"last_chunk_{key}"] = float(last[key])
    return {"env_steps": int(runner.env_steps), "seeds": rows}


def restore_cell(directory: Path):
    """A finished cell's sweep, its program, the newest checkpoint's chunk and state (stacked over seeds)."""
    sweep = Sweep.load(directory)
    return sweep, *sweep.restore_group(0)


def training_task_player(env, driver):
    """``play(params, key)``, compiled once: a policy of ``driver``'s run on ``env`` (a cell's training
    task) for one of its fixed-length episodes, ``(obs, action, timestep)`` of every step, time-major,
    the action as the policy drew it (as r̂ was handed it in training)."""
    act = driver.agent.make_policy(driver.agent_config, env.spec)
    observe = lambda obs, action, timestep: (obs, action, timestep)
    steps = env.spec.max_episode_steps
    return jax.jit(lambda params, key: evaluation.play(act, params, env, key, steps, observe))


def clip_sums(x: np.ndarray, length: int) -> np.ndarray:
    """``[T, n]`` per-step values -> the sums of every whole ``length``-step clip of each copy."""
    whole = x.shape[0] // length * length
    return x[:whole].reshape(-1, length, x.shape[1]).sum(axis=1).ravel()


def unhealthy(timestep) -> np.ndarray:
    """Which steps of a play the task counts unhealthy (none where it has no such notion)."""
    return np.asarray(timestep.info.get("unhealthy", np.zeros_like(timestep.reward))) > 0


def by_health(plays: dict, per_step: dict, name: str) -> dict:
    """Where a reward puts its highs: its mean per step (``per_step[who]``, ``[T, copies]``) on
    the healthy and the unhealthy steps of the cell's own play and of the other cell's, in units
    of its standard deviation over all of them, so that r̂ and the oracle compare. A policy that
    lies fallen while r̂ pays less for lying than for upright steps, as the oracle does, is stuck
    by its optimisation; one whose fallen steps r̂ pays about as much is stuck by r̂."""
    steps = {side: ([], []) for side in ("cell", "other")}
    for who, (_, _, t) in plays.items():
        values, fallen = per_step[who].ravel(), unhealthy(t).ravel()
        steps[who[0]][0].append(values[~fallen])
        steps[who[0]][1].append(values[fallen])
    scale = np.std(np.concatenate([x for pair in steps.values() for part in pair for x in part])) or 1.0
    mean = lambda parts: float(np.mean(np.concatenate(parts)) / scale) if sum(map(len, parts)) else float("nan")
    return {f"{name}_{side}_{health}": mean(parts)
            for side, pair in steps.items() for health, parts in zip(("healthy", "unhealthy"), pair)}


def rank_against(program: GroupProgram, state, other: Path, episodes: int) -> dict:
    """``--against``: each seed's r̂ of a restored cell (``program``, ``state``) judging its own
    policy's clips against those of ``other``'s policies."""
    _, other_program, _, other_state = restore_cell(other)
    driver, other_driver = program.driver, other_program.driver
    env = make(dataclasses.replace(driver.config.env, num_envs=episodes))
    length = driver.learner.clip_length
    seeds = [config.seed for config in program.configs]
    play_cell, play_other = training_task_player(env, driver), training_task_player(env, other_driver)
    plays = {("cell", s): play_cell(driver.policy_params(one_seed(state, i)), jax.random.PRNGKey(s))
             for i, s in enumerate(seeds)}
    for i, config in enumerate(other_program.configs):
        params = other_driver.policy_params(one_seed(other_state, i))
        plays[("other", config.seed)] = play_other(params, jax.random.PRNGKey(100 + i))
    low, high = env.spec.action_space.low, env.spec.action_space.high
    policies = {f"{side} seed {s}": {
        "oracle_reward_per_step": float(np.mean(timestep.reward)),
        "unhealthy_share": float(np.mean(unhealthy(timestep))),
        # How wide the policy has grown: the environment clips every action into its bounds.
        "actions_out_of_bounds": float(np.mean((np.asarray(action) < low) | (np.asarray(action) > high)))}
        for (side, s), (_, action, timestep) in plays.items()}
    reward = jax.jit(lambda params, o, a, t: rollout_rewards(driver.learner.reward_fn, params, o, a, t))
    oracle = {who: np.asarray(t.reward) for who, (_, _, t) in plays.items()}
    oracle_sums = {who: clip_sums(x, length) for who, x in oracle.items()}
    judges = []
    for i, s in enumerate(seeds):
        learned = driver.learned_reward(one_seed(state, i))
        rhat = {who: np.asarray(reward(learned.params, o, a, t)) for who, (o, a, t) in plays.items()}
        sums = {who: (oracle_sums[who], clip_sums(rhat[who], length)) for who in plays}
        own_oracle, own_rhat = sums[("cell", s)]
        judged = {who: play for who, play in plays.items() if who == ("cell", s) or who[0] == "other"}
        others = [sums[who] for who in sums if who[0] == "other"]
        oracle_diff = np.concatenate([(o[None, :] - own_oracle[:, None]).ravel() for o, _ in others])
        rhat_diff = np.concatenate([(h[None, :] - own_rhat[:, None]).ravel() for _, h in others])
        judges.append({"seed": s, "oracle_prefers_other": float(np.mean(oracle_diff > 0)),
                       "rhat_prefers_other": float(np.mean(rhat_diff > 0)),
                       **by_health(judged, rhat, "rhat"),
                       **by_health(judged, oracle, "oracle")})
    return {"against": str(other), "clip_length": length, "copies": episodes, "policies": policies, "judges": judges}


def diagnose(directory: Path, episodes: int, against: Path | None = None) -> dict:
    """A cell (or a train run), and with ``against`` its seeds' r̂ ranking that cell's play (:func:`rank_against`)."""
    if not (directory / "group0").exists():
        return diagnose_run(directory, episodes)
    sweep, program, chunk, state = restore_cell(directory)
    driver = program.driver
    rows = play(driver, driver.policy_params(state), episodes, seed=0)
    last = {}
    for row in sweep.rows():
        if int(row["chunk"]) == chunk:
            last[int(row["seed"])] = row
    for row, seed in zip(rows, sorted(last)):
        row["seed"] = seed
        for key in ("reward_accuracy", "reward_correlation", "episode_return"):
            if key in last[seed]:
                row[f"last_chunk_{key}"] = last[seed][key]
    result = {"chunk": chunk, "env_steps": driver.loop.steps_per_iteration * driver.loop.chunk_iterations * (chunk + 1),
              "seeds": rows}
    if against:
        result["ranked_against"] = rank_against(program, state, against, episodes)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="+", type=Path, help="sweep directories of finished cells")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--against", type=Path, help="another cell's sweep directory: rank its policies' "
                        "clips against each seed's own with that seed's r̂ (label cells only)")
    args = parser.parse_args()
    for directory in args.cells if args.against else []:
        if not (directory / "group0").exists():
            parser.error(f"--against: {directory} is not a cell's sweep directory (it has no group0/)")
        sweep = Sweep.load(directory)
        if member_config(sweep.base, sweep.groups[0][0]).reward == "env":
            parser.error(f"--against: {directory} learns from the true reward, so it has no r̂ to rank clips with")
    path = RESULTS / "mujoco_diagnose.json"
    result = json.loads(path.read_text()) if path.exists() else {"cells": {}}
    for directory in args.cells:
        key = f"{directory.parent.name}/{directory.name}"
        result["cells"][key] = diagnose(directory, args.episodes, args.against)
        print(f"{key}:", flush=True)
        cell = result["cells"][key]
        rows = [*cell["seeds"], *cell.get("ranked_against", {}).get("judges", [])]
        for row in rows:
            print("   " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
        for name, row in cell.get("ranked_against", {}).get("policies", {}).items():
            print(f"   {name} on the training task: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()))
        path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
