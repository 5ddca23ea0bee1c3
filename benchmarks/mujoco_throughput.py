"""TRPO and the RLHF loop on EnvPool's C MuJoCo, against raw EnvPool stepping at the same copies.

    python -m benchmarks.mujoco_throughput [--quick] [--tasks hopper,ant|all] [--rounds N] [--num-envs N]
        [--fit-rates 0.1,0.3] [--name NAME]

For each task, with the settings of ``configs/paper/mujoco/`` on the CPU back end (``env.id``
``envpool/<Task>-v5``, 64 copies), these sides take turns in every round, so that load from
other work falls on all of them alike (compiling excluded: each side runs once first):

* ``trpo``: TRPO on the true reward (``<task>_trpo.yaml``), one chunk as ``rlhf-jax train`` runs
  it (the same compiled chunk, which also hands back the actions its environment took);
* ``raw``: EnvPool's own Python loop, ``pool.step``, replaying those very actions on a pool
  built, seeded and reset as TRPO's: the same trajectories (checked: the replay's last
  observations against TRPO's, ``replay_max_obs_diff``, with a warning past
  ``REPLAY_TOLERANCE``), so the same physics. What a MuJoCo step costs depends on where the
  model is (over a whole run Swimmer's steps under TRPO's policy cost 1.4 times what uniform
  random actions' do), so random actions are not the same work;
* ``raw_random``: EnvPool's own loop with uniform random actions, the same copies (the raw
  side of this benchmark's earlier results);
* ``raw_xla``: EnvPool's XLA interface alone, its step in a bare jitted ``lax.scan`` over the
  same actions, on a third such pool: the pool with neither Python nor our environment around it;
* ``env``: our environment stepped inside a jitted ``lax.scan`` (uniform random actions), through
  EnvPool's XLA interface, on a pool of its own: what the agents' rollouts pay for the
  environment alone, against ``raw_random``;
* ``rlhf``: the RLHF loop (``<task>.yaml``: 700 labels, hidden ends, no torque cost, r̂ fitted at
  the config's rate, ``rlhf_fit_rate``: 0.3 pairs per env step, 1.0 on InvertedPendulum; 1.0 on
  every task in results without that key), one chunk;
* ``rlhf_fit_<rate>``, one for each of ``--fit-rates`` (default: the library's, 0.1 pairs per env
  step, the paper's Atari rate; it gives none for MuJoCo): the same loop with the reward model
  fitted at that rate instead of the config's, so what the loop costs at another fitting rate
  (in earlier results the one side ``rlhf_default_fit``, at 0.1).

Each figure is the median over rounds, with [min, max]; each ratio is the median of the
ratios measured within a round, and, as ``*_all_rounds``, the ratio of the two sides' total
times (with ``--rounds 66`` TRPO's chunks make a whole 1M-step run, its policy changing as it
learns, and so does what its trajectories cost to simulate). The machine's load average is
recorded beside every measurement. Targets: ``trpo_over_raw`` >= 0.8 at 64 copies,
``rlhf_over_trpo`` >= 0.5 (``trpo_over_raw_random`` beside the first, for comparison with
earlier runs; ``rlhf_fit_<rate>_over_trpo`` beside the second, with no target of its own).
Beside them, what the time goes to: a TRPO iteration's time (from its median rate) against
the same env steps of raw EnvPool, TRPO's own time per iteration on a stand-in environment that
costs nothing (:class:`CostlessEnv`), split into its rollout and its update, and XLA's count of the
arithmetic per env step of TRPO and of the loop (its fitting apart).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import envpool
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import Headline, Target, cpu_overrides, enable_compilation_cache, write_result
from benchmarks.rlhf_overhead import flops_per_env_step
from rlhf_jax.cli import whole_number
from rlhf_jax.config import ExperimentConfig, load_config
from rlhf_jax.envs.core import Environment, EnvSpec, TimeStep, clip_action
from rlhf_jax.envs.envpool_envs import x64
from rlhf_jax.reward.config import PreferenceConfig
from rlhf_jax.dispatch import repeat
from rlhf_jax.driver import Driver, true_reward_env_config


PAPER_MUJOCO = Path(__file__).resolve().parent.parent / "configs" / "paper" / "mujoco"
# Figure 2's eight tasks, in its order: ``<task>.yaml`` learns from labels, ``<task>_trpo.yaml``
# is TRPO on the true reward.
MUJOCO_TASKS = ("reacher", "halfcheetah", "hopper", "walker2d", "swimmer", "ant", "invertedpendulum",
                "inverteddoublependulum")
# How far a replay's observations may be from TRPO's and still be the same trajectories: float32
# rounding of float64 observations gives about 1e-6; a replay that lost step ends up O(1) apart.
REPLAY_TOLERANCE = 1e-3
# The reward model's fitting rate of the loop's other side, unless --fit-rates names others: the
# library's default (PreferenceConfig).
DEFAULT_FIT_RATE = PreferenceConfig.fit_pairs_per_env_step


def fit_side(rate: float) -> str:
    """The name of the loop's side fitting r̂ at ``rate`` pairs per env step."""
    return f"rlhf_fit_{rate:g}"


def load() -> float:
    return round(os.getloadavg()[0], 2)


class Raw:
    """EnvPool's own loop: ``steps`` vector steps of random actions."""

    def __init__(self, name: str, num_envs: int, steps: int):
        self.pool = envpool.make(name, env_type="gymnasium", num_envs=num_envs, seed=0)
        self.pool.reset()
        space = self.pool.action_space
        self.actions = np.random.default_rng(0).uniform(space.low, space.high, (steps, num_envs, *space.shape))
        self.env_steps = steps * num_envs

    def __call__(self):
        for action in self.actions:
            self.pool.step(action)


class TrpoChunk:
    """One chunk of TRPO on the true reward, compiled as ``rlhf-jax train`` compiles it
    (:func:`rlhf_jax.dispatch.repeat` over the agent's iteration), that also hands back
    the actions its environment took (clipped into the bounds, as :func:`env_step` gives them),
    for :class:`Replay`; the first call compiles."""

    def __init__(self, config: ExperimentConfig):
        self.driver = driver = Driver(config)
        space = driver.env.spec.action_space

        def step(runner):
            runner, metrics, transitions = driver.loop.iteration(runner)
            return runner, (metrics, clip_action(space, transitions.action))

        self.run = repeat(step, driver.compiled.dispatch)
        self.state = driver.init(jax.random.PRNGKey(0))
        self.env_steps = driver.loop.chunk_iterations * driver.loop.steps_per_iteration
        self.taken = []  # [chunk iterations, steps, num_envs, ...], one per chunk run
        self()

    def __call__(self):
        self.state, (metrics, actions) = self.run(self.state, self.driver.loop.chunk_iterations)
        jax.block_until_ready((self.state, metrics))
        self.taken.append(actions)


class Replay:
    """EnvPool's own loop stepping the actions a :class:`TrpoChunk` took, on a pool of the same
    task, options and seed reset as its environment was: the same trajectories. ``prepare``
    (untimed) takes the chunks it has not yet replayed; the first (the compiling call's) is
    replayed at once, so that both pools stay step for step together."""

    def __init__(self, source: TrpoChunk):
        config = true_reward_env_config(source.driver.config)
        self.source, self.env_steps, self.last_obs, self.replayed = source, source.env_steps, None, 0
        self.pool = envpool.make(config.name, env_type="gymnasium", num_envs=config.num_envs, seed=config.seed,
                                 **source.driver.env.pool_options)
        self.start()
        self.prepare()
        self()

    def start(self):
        self.pool.reset()

    def prepare(self):
        chunks = [np.asarray(a, np.float64) for a in self.source.taken[self.replayed:]]
        self.replayed = len(self.source.taken)
        self.actions = np.concatenate([a.reshape((-1,) + a.shape[2:]) for a in chunks])

    def __call__(self):
        for action in self.actions:
            self.last_obs, *_ = self.pool.step(action)

    def max_obs_diff(self) -> float:
        """How far the replay's last observations are from TRPO's (float32 rounding: ~1e-6)."""
        return float(np.max(np.abs(np.asarray(self.last_obs, np.float64) - np.asarray(self.source.state.obs))))


class ReplayXla(Replay):
    """EnvPool's XLA interface alone replaying TRPO's actions: its step in a bare jitted
    ``lax.scan`` over them, with neither Python nor our environment around it."""

    def start(self):
        self.pool.reset()
        with x64():
            handle, _, _, xla_step = self.pool.xla()

        def run(handle, actions):
            def body(handle, action):
                handle, (obs, *_) = xla_step(handle, action)
                return handle, obs
            handle, obs = jax.lax.scan(body, handle, actions)
            return handle, obs[-1]

        with x64():
            self.run = jax.jit(run)
        self.handle = jnp.asarray(handle)

    def prepare(self):
        super().prepare()
        with x64():
            self.actions = jnp.asarray(self.actions)

    def __call__(self):
        with x64():
            self.handle, self.last_obs = self.run(self.handle, self.actions)
            jax.block_until_ready(self.last_obs)


class OurEnv:
    """Our environment, as the agents' rollouts step it: ``steps`` steps of uniform random
    actions in one jitted scan."""

    def __init__(self, driver, steps: int):
        env = driver.env
        space = env.action_space
        shape = (env.num_envs, *space.shape)

        def run(state, key):
            def body(state, key):
                action = jax.random.uniform(key, shape, minval=space.low, maxval=space.high)
                state, timestep = env.step(state, action)
                return state, timestep.reward.sum()
            return jax.lax.scan(body, state, jax.random.split(key, steps))

        self.run = jax.jit(run)
        self.state, self.key = env.reset(jax.random.PRNGKey(0))[0], jax.random.PRNGKey(1)
        self.env_steps = steps * env.num_envs
        self()

    def __call__(self):
        self.key, key = jax.random.split(self.key)
        self.state, total = self.run(self.state, key)
        jax.block_until_ready(total)


class Chunk:
    """One chunk of a run, as ``rlhf-jax train`` runs it; the first call compiles."""

    def __init__(self, config: ExperimentConfig):
        self.driver = Driver(config)
        self.state = self.driver.init(jax.random.PRNGKey(0))
        self.env_steps = self.driver.loop.chunk_iterations * self.driver.loop.steps_per_iteration
        self()

    def __call__(self):
        self.state, metrics, _ = self.driver.run_chunk(self.state, 1)
        jax.block_until_ready((self.state, metrics))


class CostlessEnv(Environment):
    """A stand-in with a real task's shapes whose steps cost nothing (random observations, a
    few episode ends): TRPO's iteration on it is what the agent itself costs, apart from the
    environment, and does not swing with the pool's speed as the real iteration does."""

    def __init__(self, spec: EnvSpec):
        self.spec = spec

    def _timestep(self, key):
        obs = jax.random.normal(key, (self.num_envs, *self.observation_shape))
        ended = jax.random.uniform(jax.random.fold_in(key, 1), (self.num_envs,)) < 1.0 / self.spec.max_episode_steps
        no = jnp.zeros((self.num_envs,), bool)
        reward = obs.reshape(self.num_envs, -1).sum(-1)
        return TimeStep(obs, reward, ended, no, obs, no, {"true_reward": reward, "true_done": ended})

    def _reset(self, key):
        return key, self._timestep(key)

    def _step(self, key, action):
        key = jax.random.fold_in(key, 2)
        return key, self._timestep(key)


def agent_ms(driver, repeats: int = 15) -> dict:
    """TRPO's own time per iteration, on a :class:`CostlessEnv` of the task's shapes: the whole
    iteration, its rollout (the policy's passes) and the difference, the update; medians, in ms."""
    from rlhf_jax.agents import trpo
    from rlhf_jax.agents.base import env_reward

    config, env = driver.agent_config, CostlessEnv(driver.env.spec)
    iteration = jax.jit(lambda r: trpo.make_iteration(config, env, env_reward)(r)[0], donate_argnums=0)
    rollout = trpo.make_rollout(config, env)
    rollout_only = jax.jit(lambda r: r._replace(**dict(zip(("env_state", "obs", "key"), rollout(
        r.params, r.env_state, r.obs, r.key)[0]))), donate_argnums=0)
    runner = jax.jit(lambda key: trpo.init_runner(key, config, env))(jax.random.PRNGKey(0))
    times = {"iteration": [], "rollout": []}
    for step in (iteration, rollout_only):
        runner = jax.block_until_ready(step(runner))  # compiles
    for _ in range(repeats):  # in turn, so that load falls on both alike
        for name, step in (("iteration", iteration), ("rollout", rollout_only)):
            start = time.perf_counter()
            runner = jax.block_until_ready(step(runner))
            times[name].append(1e3 * (time.perf_counter() - start))
    whole, policy = float(np.median(times["iteration"])), float(np.median(times["rollout"]))
    return {"agent_iteration_ms": whole, "agent_rollout_ms": policy, "agent_update_ms": whole - policy}


def measure(task: str, num_envs: int, rounds: int, chunk_env_steps: int, fit_rates: tuple[float, ...]) -> dict:
    rl, rlhf = PAPER_MUJOCO / f"{task}_trpo.yaml", PAPER_MUJOCO / f"{task}.yaml"
    size = [f"env.num_envs={num_envs}", f"run.chunk_env_steps={chunk_env_steps}"]
    trpo_config = load_config(ExperimentConfig, rl, [*cpu_overrides(rl), *size])
    rlhf_overrides = [*cpu_overrides(rlhf), *size]
    rlhf_config = load_config(ExperimentConfig, rlhf, rlhf_overrides)
    slower_fits = {fit_side(rate): Chunk(load_config(ExperimentConfig, rlhf, [
        *rlhf_overrides, f"preferences.fit_pairs_per_env_step={rate}"])) for rate in fit_rates}
    trpo = TrpoChunk(trpo_config)
    steps = trpo.env_steps // num_envs
    # trpo first in every round, so that raw replays the actions of the round's own chunk
    sides = {"trpo": trpo, "raw": Replay(trpo), "raw_random": Raw(trpo_config.env.name, num_envs, steps),
             "raw_xla": ReplayXla(trpo),
             "env": OurEnv(Driver(trpo_config), steps), "rlhf": Chunk(rlhf_config), **slower_fits}
    rates = {name: [] for name in sides}
    seconds = {name: 0.0 for name in sides}
    loads = []
    for _ in range(rounds):
        for name, side in sides.items():
            if isinstance(side, Replay):  # the actions of this round's trpo chunk
                side.prepare()
            loads.append(load())
            start = time.perf_counter()
            side()
            took = time.perf_counter() - start
            rates[name].append(side.env_steps / took)
            seconds[name] += took
    ratios = {
        "raw_xla_over_raw": [x / r for x, r in zip(rates["raw_xla"], rates["raw"])],
        "env_over_raw_random": [e / r for e, r in zip(rates["env"], rates["raw_random"])],
        "raw_random_over_raw": [x / r for x, r in zip(rates["raw_random"], rates["raw"])],
        "trpo_over_raw_xla": [t / x for t, x in zip(rates["trpo"], rates["raw_xla"])],
        "trpo_over_raw": [t / r for t, r in zip(rates["trpo"], rates["raw"])],
        "trpo_over_raw_random": [t / r for t, r in zip(rates["trpo"], rates["raw_random"])],
        "rlhf_over_trpo": [h / t for h, t in zip(rates["rlhf"], rates["trpo"])],
        **{f"{name}_over_trpo": [h / t for h, t in zip(rates[name], rates["trpo"])] for name in slower_fits},
    }
    flops = flops_per_env_step(sides["rlhf"].driver, sides["trpo"].driver)
    drift = max(sides["raw"].max_obs_diff(), sides["raw_xla"].max_obs_diff())
    if drift >= REPLAY_TOLERANCE:
        print(f"{task}: the replays left TRPO's trajectories (observations {drift:.2g} apart): raw is not the same "
              f"work, and trpo_over_raw compares unlike steps", flush=True)
    result = {
        "num_envs": num_envs, "rounds": rounds, "rlhf_fit_rate": rlhf_config.preferences.fit_pairs_per_env_step,
        "fit_rates": list(fit_rates), "env_steps_per_measurement": {n: s.env_steps for n, s in sides.items()},
        "replay_max_obs_diff": drift,
        "replay_same_trajectories": drift < REPLAY_TOLERANCE,
        "load_during": {"median": float(np.median(loads)), "min": min(loads), "max": max(loads)},
        **{f"{name}_steps_per_s": round(float(np.median(v)), 1) for name, v in rates.items()},
        **{f"{name}_steps_per_s_range": [round(min(v), 1), round(max(v), 1)] for name, v in rates.items()},
        **{name: round(float(np.median(v)), 4) for name, v in ratios.items()},
        # over all rounds together: the same env steps on both sides, so the ratio of the times
        # (over a whole run's worth of rounds, what the run as a whole would see)
        "trpo_over_raw_all_rounds": round(seconds["raw"] / seconds["trpo"], 4),
        "trpo_over_raw_random_all_rounds": round(seconds["raw_random"] / seconds["trpo"], 4),
        "rlhf_over_trpo_all_rounds": round(seconds["trpo"] / seconds["rlhf"], 4),
        **{f"{name}_range": [round(min(v), 4), round(max(v), 4)] for name, v in ratios.items()},
        **{f"{name}_iteration_ms": round(1e3 * sides["trpo"].driver.loop.steps_per_iteration / float(np.median(rates[name])), 2)
           for name in ("trpo", "raw", "raw_random")},
        **{f"trpo_{k}": round(v, 2) for k, v in agent_ms(sides["trpo"].driver).items()},
        **{f"flops_per_env_step_{k}": round(v) for k, v in flops.items()},
    }
    print(f"{task}: {result}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Hopper only, 3 rounds")
    parser.add_argument("--tasks", default="hopper",
                        help=f"comma-separated, of {', '.join(MUJOCO_TASKS)}; or all of them: all")
    parser.add_argument("--rounds", type=whole_number(1), default=5)
    parser.add_argument("--num-envs", type=whole_number(1), default=64)
    parser.add_argument("--chunk-env-steps", type=whole_number(1), default=20_000, help="env steps per measurement (about)")
    parser.add_argument("--fit-rates", default=str(DEFAULT_FIT_RATE),
                        help="comma-separated fitting rates (pairs per env step) of the loop's other sides")
    parser.add_argument("--name", help="the result's name (default: mujoco_throughput, or mujoco_throughput_quick), "
                                       "so that a run of another shape does not replace the figures of record")
    args = parser.parse_args()
    tasks = ["hopper"] if args.quick else list(MUJOCO_TASKS) if args.tasks == "all" else args.tasks.split(",")
    if unknown := [task for task in tasks if task not in MUJOCO_TASKS]:
        parser.error(f"--tasks: no MuJoCo task {', '.join(unknown)} (known: {', '.join(MUJOCO_TASKS)}, or all)")
    try:
        fit_rates = tuple(float(rate) for rate in args.fit_rates.split(","))
    except ValueError:
        parser.error(f"--fit-rates: not a comma-separated list of numbers: {args.fit_rates!r}")
    if bad := [rate for rate in fit_rates if rate <= 0]:
        parser.error(f"--fit-rates: a fitting rate is a positive number of pairs per env step, not {bad[0]:g}")
    enable_compilation_cache()
    rounds = 3 if args.quick else args.rounds
    load_before = load()
    results = {task: measure(task, args.num_envs, rounds, args.chunk_env_steps, fit_rates) for task in tasks}
    write_result(args.name or ("mujoco_throughput_quick" if args.quick else "mujoco_throughput"), {
        "quick": args.quick, "load_before": load_before, "load_after": load(), "tasks": results,
    }, headline=headline)


def headline(result: dict) -> list[Headline]:
    """The report's rows, per task: TRPO over raw EnvPool stepping its actions (target 0.8), over
    raw EnvPool's random actions and EnvPool's XLA step alone (no target), the loop over TRPO
    (target 0.5)."""
    rows = []
    for task, r in result["tasks"].items():
        n = r["num_envs"]
        replay = "trpo_over_raw_random" in r  # since raw replays TRPO's own actions
        rows.append(Headline(f"{task}: TRPO (true reward) env steps/s vs raw EnvPool stepping"
                             f"{' the same actions' if replay else ''}, {n} copies",
                             r["trpo_steps_per_s"], r["raw_steps_per_s"], r["trpo_over_raw"],
                             Target.on(r, "trpo_over_raw", ">=", 0.8)))
        if replay:
            rows.append(Headline(f"{task}: TRPO (true reward) env steps/s vs raw EnvPool stepping uniform random "
                                 f"actions, {n} copies", r["trpo_steps_per_s"], r["raw_random_steps_per_s"],
                                 r["trpo_over_raw_random"]))
        if "trpo_over_raw_xla" in r:  # measured since EnvPool's MuJoCo steps through its XLA interface
            rows.append(Headline(f"{task}: TRPO (true reward) env steps/s vs EnvPool's XLA step alone in a jitted "
                                 f"scan{' of the same actions' if replay else ''}, {n} copies",
                                 r["trpo_steps_per_s"], r["raw_xla_steps_per_s"], r["trpo_over_raw_xla"]))
        # the config's fitting rate, recorded since it stopped being 1.0 on every task
        config_rate = r.get("rlhf_fit_rate", 1.0)
        rows.append(Headline(f"{task}: RLHF loop (700 labels, fitting {float(config_rate)} pairs per env step as its config "
                             f"does) env steps/s vs TRPO on the true reward, {n} copies",
                             r["rlhf_steps_per_s"], r["trpo_steps_per_s"], r["rlhf_over_trpo"],
                             Target.on(r, "rlhf_over_trpo", ">=", 0.5)))
        for rate in r.get("fit_rates", []):  # absent from earlier results
            side = fit_side(rate)
            rows.append(Headline(f"{task}: RLHF loop (700 labels) fitting {float(rate)} pairs per env step "
                                 f"instead of its config's {float(config_rate)}, env steps/s vs TRPO on the true reward, "
                                 f"{n} copies",
                                 r[f"{side}_steps_per_s"], r["trpo_steps_per_s"], r[f"{side}_over_trpo"]))
    return rows


if __name__ == "__main__":
    main()
