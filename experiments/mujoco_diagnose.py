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

With ``--by-life`` (label cells on a task whose failing copies restart, ``env.hidden_end=reset``),
each seed's r̂ and the oracle are read on 16 copies of the cell's training task played with
Gaussian actions (std 0.3) for 400 steps, by a step's place in its life (steps since the
restart; -1 the restart's own step, whose action is ignored), and on the same steps with every
action set to -1, -0.5, 0, 0.5 and 1: where r̂ pays one action more than another on a task
whose reward ignores the action. Printed only. With ``--held-labels`` (label cells on Hopper or
Walker2d), each seed's held labels are split by how many of a pair's two clips hold a fall (a
step whose observation is outside Gymnasium's healthy range, :func:`fallen`), with r̂'s agreement
with the answers in each split (:func:`split_by_falls`), and what a fall costs in r̂ against the
oracle's penalty (:func:`implied_penalty`): how much of the penalty r̂ has learned from the
labels it was fitted on. Printed only. With ``--export-rewards DIR`` each seed's r̂ of the
newest checkpoint is written to ``DIR/<cell>-group<g>-seed<k>.npz``, a file
``reward_model.init_from`` starts a run from (with ``preferences.fit_pairs_per_env_step=0``, a
run on that r̂ frozen).

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
from rlhf_jax.cli import whole_number
from rlhf_jax.envs.core import clip_action
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.reward import ensemble as reward_model
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


def export_rewards(directory: Path, out: Path) -> list[Path]:
    """Each seed's r̂ of a sweep's newest checkpoints as saved reward models
    (:mod:`rlhf_jax.reward.saved_model`), one file per group and seed."""
    from rlhf_jax.config import to_dict
    from rlhf_jax.reward import saved_model

    sweep = Sweep.load(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for group in range(len(sweep.groups)):
        program, chunk, state = sweep.restore_group(group)
        for s, config in enumerate(program.configs):
            learner = one_seed(state, s).learner
            info = saved_model.ModelInfo(
                env=to_dict(config)["env"], observation_shape=tuple(program.driver.env.spec.observation_shape),
                architecture=saved_model.architecture(config.reward_model), labels=int(learner.labels.ring.size),
                dataset=f"{directory} (group {group}, checkpoint {chunk})", steps=0, train_loss=float("nan"),
                val_loss=float("nan"))
            paths.append(out / f"{directory.name}-group{group}-seed{config.seed}.npz")
            saved_model.save(paths[-1], learner.ensemble, info)
    return paths


LIFE_AGES = (-1, 0, 1, 2, 3, 4, 6, 8)
FIXED_ACTIONS = (-1.0, -0.5, 0.0, 0.5, 1.0)


def by_life(directory: Path, steps: int = 400, copies: int = 16) -> dict:
    """Per seed: r̂ and the oracle by a step's place in its life, and r̂ with every action fixed
    (the module docstring's ``--by-life``)."""
    _, program, _, state = restore_cell(directory)
    driver = program.driver
    env = make(dataclasses.replace(driver.config.env, num_envs=copies))
    drawn = lambda params, obs, key: 0.3 * jax.random.normal(key, (copies, *env.spec.action_space.shape))
    obs, actions, timestep = evaluation.play(drawn, None, env, jax.random.PRNGKey(1), steps, lambda *step: step)
    failing, ages, age = unhealthy(timestep), [], np.zeros(copies, int)
    for failed in failing:  # [T, N]: each step's age in its life; after a failing step, the restart's (-1)
        ages.append(age)
        age = np.where(failed, -1, age + 1)
    obs, actions = (np.asarray(x).reshape(steps * copies, *x.shape[2:]) for x in (obs, actions))
    oracle, ages = np.asarray(timestep.reward).ravel(), np.concatenate(ages)
    result = {}
    for s, config in enumerate(program.configs):
        learned = driver.learned_reward(one_seed(state, s))
        r_hat = lambda a: np.asarray(learned.fn(learned.params, jnp.asarray(obs), jnp.asarray(a), None))
        played = r_hat(actions)
        early = (ages >= 0) & (ages <= 2)
        result[str(config.seed)] = {
            "by_age": {str(a): {"r_hat": float(played[ages == a].mean()), "oracle": float(oracle[ages == a].mean())}
                       for a in LIFE_AGES if (ages == a).sum() > 5},
            "r_hat_early_in_life_by_action": {str(v): float(r_hat(np.full_like(actions, v))[early].mean())
                                              for v in FIXED_ACTIONS},
            "correlation": float(np.corrcoef(played, oracle)[0, 1])}
    return result


# The tasks whose falls --held-labels reads, by Gymnasium's name, with their number of qpos
# entries: the observation is qpos without x, then qvel (their health rules: mjx_tasks.TASKS).
QPOS_SIZE = {"Hopper-v5": 6, "Walker2d-v5": 9}


def fallen(task: str, obs: np.ndarray) -> np.ndarray:
    """Which observations ``[..., obs_dim]`` of ``task`` (a key of :data:`QPOS_SIZE`) its health
    rule (``mjx_tasks.TASKS[task].healthy_fn``, Gymnasium v5's ``is_healthy``) calls fallen, read on
    the state rebuilt from the observation (x, which no rule reads, 0; Hopper's velocities as the
    observation clips them, at 10, inside the rule's bound of 100)."""
    from types import SimpleNamespace

    from rlhf_jax.envs.mjx_tasks import TASKS

    qpos_size, rule = QPOS_SIZE[task], TASKS[task].healthy_fn
    flat = np.asarray(obs).reshape(-1, obs.shape[-1])
    qpos = np.concatenate([np.zeros((len(flat), 1)), flat[:, :qpos_size - 1]], axis=1)
    healthy = jax.vmap(lambda p, v: rule(SimpleNamespace(qpos=p, qvel=v)))
    return ~np.asarray(healthy(qpos, flat[:, qpos_size - 1:])).reshape(obs.shape[:-1])


def split_by_falls(falls: np.ndarray, mu: np.ndarray, rhat: np.ndarray) -> dict:
    """Held labels split by how many clips of each pair fall (``falls [n, 2]``, falls per clip):
    per split (no clip, one, both), how many pairs and how often r̂'s clip sums (``rhat [n, 2]``)
    prefer the clip the answer (``mu [n]``; ties left out) does."""
    decided = mu != 0.5
    agrees = ((rhat[:, 0] > rhat[:, 1]) == (mu > 0.5)) & decided
    fallen_clips = (falls > 0).sum(axis=1)
    result = {}
    for count, name in enumerate(("no_fall", "one_fall", "both_fall")):
        rows = (fallen_clips == count) & decided
        result[f"{name}_pairs"] = int(rows.sum())
        result[f"{name}_rhat_agrees"] = float(agrees[rows].mean()) if rows.any() else float("nan")
    return result


def implied_penalty(falls: np.ndarray, rhat: np.ndarray, oracle: np.ndarray, penalty: float) -> dict:
    """What a fall costs in r̂, in the oracle's units, and what the labels could have told it.

    A clip's oracle sum is its progress less ``penalty`` per fall, ``R = P - penalty F``, so
    ``P = R + penalty F``. Fitting r̂'s clip sums by least squares, ``R̂ ≈ a P + b F + c``, r̂
    charges a fall ``-b / a`` units of progress (the same fit of the oracle's sums gives back
    ``penalty``, a check on the falls counted). A preference between two clips only says which
    is larger: on the pairs where exactly one clip falls, the labels bound the penalty from
    below by the fallen clip's largest lead in progress, and say nothing above it.
    Arrays are ``[n, 2]`` (pairs x clips)."""
    progress = oracle + penalty * falls
    design = np.stack([progress.ravel(), falls.ravel(), np.ones(progress.size)], axis=1)
    coefficients, *_ = np.linalg.lstsq(design, rhat.ravel(), rcond=None)
    (a, b, _), fitted = coefficients, design @ coefficients
    (a_oracle, b_oracle, _), *_ = np.linalg.lstsq(design, oracle.ravel(), rcond=None)
    one = (falls > 0).sum(axis=1) == 1
    side = (falls[one] > 0).argmax(axis=1)
    lead = progress[one, side] - progress[one, 1 - side]  # the fallen clip's progress over the other's
    return {"falls_per_clip": float(falls.mean()), "oracle_penalty_fitted": float(-b_oracle / a_oracle),
            "rhat_penalty": float(-b / a), "rhat_fit_r2": float(1 - np.var(rhat.ravel() - fitted) / np.var(rhat)),
            "one_fall_pairs": int(one.sum()),
            "largest_lead_of_a_fallen_clip": float(lead.max()) if one.any() else float("nan"),
            "leads_above_rhat_penalty": float(np.mean(lead > -b / a)) if one.any() else float("nan")}


def held_labels(directory: Path) -> dict:
    """``--held-labels``: :func:`split_by_falls` and :func:`implied_penalty` of each seed's held
    labels, r̂ of the newest checkpoint."""
    _, program, _, state = restore_cell(directory)
    driver = program.driver
    task = driver.config.env.id.split("/")[-1]
    if task not in QPOS_SIZE:
        raise SystemExit(f"--held-labels: {directory} runs {driver.config.env.id}; falls are read on {sorted(QPOS_SIZE)}")
    learner, result = driver.learner, {}
    for s, config in enumerate(program.configs):
        held = one_seed(state, s).learner
        labels, n = held.labels, int(held.labels.ring.size)
        obs, action = labels.observations(jnp.arange(n)), labels.action[:n]
        members = reward_model.member_returns(held.ensemble, learner.model, learner.spec, obs, action)
        rhat = np.asarray(reward_model.average_normalized(held.ensemble, learner.model, learner.spec, members).sum(-1))
        falls = fallen(task, np.asarray(obs)).sum(axis=-1)  # [n, 2]: each fall is one step, then the restart
        oracle = np.asarray(labels.oracle_return[:n])
        result[str(config.seed)] = {"labels": n, **split_by_falls(falls, np.asarray(labels.mu[:n]), rhat),
                                    **implied_penalty(falls, rhat, oracle, driver.config.env.termination_penalty)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="+", type=Path, help="sweep directories of finished cells")
    parser.add_argument("--episodes", type=whole_number(1), default=8)
    parser.add_argument("--against", type=Path, help="another cell's sweep directory: rank its policies' "
                        "clips against each seed's own with that seed's r̂ (label cells only)")
    parser.add_argument("--by-life", action="store_true", help="each seed's r̂ against the oracle by a step's "
                        "place in its life, and with every action fixed (tasks whose failing copies restart)")
    parser.add_argument("--held-labels", action="store_true", help="each seed's held labels split by how many "
                        "of a pair's clips fall, and how r̂ ranks each split (Hopper, Walker2d)")
    parser.add_argument("--export-rewards", type=Path, metavar="DIR",
                        help="write each seed's r̂ to DIR/<cell>-group<g>-seed<k>.npz, for reward_model.init_from")
    args = parser.parse_args()
    for directory in [*args.cells, *([args.against] if args.against else [])]:
        if not (directory / "group0").exists():
            parser.error(f"{directory} is not a cell's sweep directory (it has no group0/)")
    option = ("--against" if args.against else "--by-life" if args.by_life else
              "--held-labels" if args.held_labels else "--export-rewards")
    for directory in args.cells if (args.against or args.by_life or args.held_labels or args.export_rewards) else []:
        sweep = Sweep.load(directory)
        reward = member_config(sweep.base, sweep.groups[0][0]).reward
        if reward != "preferences":
            what = "the true reward" if reward == "env" else f"reward={reward}"
            parser.error(f"{option}: {directory} learns from {what}, so it has no preference r̂ to read")
    if args.export_rewards or args.by_life or args.held_labels:
        for directory in args.cells:
            if args.held_labels:
                print(json.dumps({directory.name: held_labels(directory)}, indent=1))
            if args.export_rewards:
                print("\n".join(str(path) for path in export_rewards(directory, args.export_rewards)))
            if args.by_life:
                print(json.dumps({directory.name: by_life(directory)}, indent=1))
        return
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
