"""Environment steps per second of each back end, and what our wrappers cost.

    python -m benchmarks.env_throughput [--quick [--mjx]]
    python -m benchmarks.env_throughput --only-mjx [--quick]   # MJX's Hopper alone, e.g. on a GPU

Ratios are measured in one run, side by side, because the machines are shared:

* ``envpool_xla_over_python``: Pong stepped through our EnvPool XLA wrapper inside a
  jitted ``lax.scan``, over EnvPool's own Python loop at the same number of
  environments (target >= 0.95);
* ``atari_modified_over_plain``: the same with the papers' modifications on (score
  hidden, no episode ends, penalty) over without (target >= 0.95);
* ``gymnax_ours_over_raw``: CartPole through our protocol over gymnax's own vmapped step.
"""
from __future__ import annotations

import argparse

import jax
import numpy as np

from benchmarks.common import (Headline, Side, Target, enable_compilation_cache, results_folder, steps_per_second,
                               write_result)
from rlhf_jax.cli import whole_number
from rlhf_jax.envs import Discrete, EnvConfig, make


def scan_runner(env, steps: int):
    """A compiled function running ``steps`` random-action steps, and its starting state."""
    space = env.action_space

    def act(key):
        shape = (env.num_envs,) + tuple(space.shape)
        if isinstance(space, Discrete):
            return jax.random.randint(key, shape, 0, space.n)
        return jax.random.uniform(key, shape, minval=space.low, maxval=space.high)

    @jax.jit
    def run(state, key):
        def body(carry, key):
            state, total = carry
            state, timestep = env.step(state, act(key))
            return (state, total + timestep.reward.sum()), None

        (state, total), _ = jax.lax.scan(body, (state, 0.0), jax.random.split(key, steps))
        return state, total

    state, _ = env.reset(jax.random.PRNGKey(0))
    return run, state


def measure_scan(env, steps: int, repeats: int) -> float:
    run, state = scan_runner(env, steps)
    holder = {"state": state, "key": jax.random.PRNGKey(1)}

    def once():
        holder["key"], key = jax.random.split(holder["key"])
        holder["state"], total = run(holder["state"], key)
        total.block_until_ready()

    once()  # compile
    return steps_per_second(once, steps * env.num_envs, repeats)


def envpool_python_side(name: str, num_envs: int, steps: int) -> Side:
    """EnvPool's own Python loop of ``steps`` random-action steps, as one side of a timing."""
    import envpool

    pool = envpool.make(name, env_type="gymnasium", num_envs=num_envs, seed=0, reward_clip=False)
    pool.reset()
    rng = np.random.default_rng(0)
    n = pool.action_space.n

    def once():
        for _ in range(steps):
            pool.step(rng.integers(0, n, num_envs))

    return Side(once, steps * num_envs)


def measure_envpool_python(name: str, num_envs: int, steps: int, repeats: int) -> float:
    """EnvPool's own Python loop: the baseline the XLA path is held to."""
    side = envpool_python_side(name, num_envs, steps)
    side.run()
    return steps_per_second(side.run, side.units, repeats)


def measure_gymnax_raw(num_envs: int, steps: int, repeats: int) -> float:
    import gymnax

    env, params = gymnax.make("CartPole-v1")
    keys = jax.random.split(jax.random.PRNGKey(0), num_envs)
    _, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)

    @jax.jit
    def run(state, key):
        def body(carry, key):
            state, total = carry
            step_key, action_key = jax.random.split(key)
            action = jax.random.randint(action_key, (num_envs,), 0, 2)
            _, state, reward, _, _, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, num_envs), state, action, params
            )
            return (state, total + reward.sum()), None

        (state, total), _ = jax.lax.scan(body, (state, 0.0), jax.random.split(key, steps))
        return state, total

    holder = {"state": state}

    def once():
        holder["state"], total = run(holder["state"], jax.random.PRNGKey(2))
        total.block_until_ready()

    once()
    return steps_per_second(once, steps * num_envs, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small budgets: under a minute on 2 CPU cores")
    parser.add_argument("--atari-envs", type=whole_number(1), default=8)
    parser.add_argument("--mjx", action="store_true",
                        help="measure MJX in --quick mode too (its compile alone takes ~40 s on 2 CPU cores)")
    parser.add_argument("--only-mjx", action="store_true",
                        help="measure MJX's Hopper alone and keep the stored result's other figures (where "
                             "EnvPool cannot load, as on a GPU machine without libEGL)")
    args = parser.parse_args()
    enable_compilation_cache()
    quick = args.quick
    repeats = 2 if quick else 3
    mjx_envs = 64 if quick else 256
    measure_mjx = lambda: measure_scan(  # noqa: E731
        make(EnvConfig(id="mjx/Hopper-v5", num_envs=mjx_envs)), 20 if quick else 200, repeats)
    if args.only_mjx:
        part = {"mjx_hopper_quick": quick, "mjx_hopper_envs": mjx_envs,
                "mjx_hopper_steps_per_s": round(measure_mjx(), 1)}
        # A stored result's "quick" is its EnvPool and gymnax parts' mode: MJX's run keeps its own.
        if not (results_folder() / "env_throughput.json").exists():
            part["quick"] = quick
        write_result("env_throughput", part, headline=headline, merge=True)
        return
    pong_steps = 100 if quick else 1000
    n = args.atari_envs
    results: dict[str, float] = {}

    # The three Pong measurements run back to back in each round, and each ratio is the
    # median over rounds of the ratio within a round: this machine's speed drifts by up to
    # 2x between rounds, which a ratio of bests would mistake for overhead.
    plain = make(EnvConfig(id="envpool/Pong-v5", num_envs=n))
    modified = make(EnvConfig(id="envpool/Pong-v5", num_envs=n, hide_score=True, hide_episode_end=True))
    rounds = []
    for _ in range(3 if quick else 7):
        rounds.append((
            measure_envpool_python("Pong-v5", n, pong_steps, repeats),
            measure_scan(plain, pong_steps, repeats),
            measure_scan(modified, pong_steps, repeats),
        ))
    python_loop, xla, xla_modified = (np.array(column) for column in zip(*rounds))
    results["envpool_pong_python_steps_per_s"] = float(np.median(python_loop))
    results["envpool_pong_xla_steps_per_s"] = float(np.median(xla))
    results["envpool_pong_modified_steps_per_s"] = float(np.median(xla_modified))
    results["envpool_xla_over_python"] = float(np.median(xla / python_loop))
    results["atari_modified_over_plain"] = float(np.median(xla_modified / xla))

    gymnax_envs = 1024
    gymnax_steps = 200 if quick else 1000
    ours = measure_scan(make(EnvConfig(id="gymnax/CartPole-v1", num_envs=gymnax_envs)), gymnax_steps, repeats)
    raw = measure_gymnax_raw(gymnax_envs, gymnax_steps, repeats)
    results["gymnax_cartpole_steps_per_s"] = ours
    results["gymnax_cartpole_raw_steps_per_s"] = raw
    results["gymnax_ours_over_raw"] = ours / raw

    hopper_envs = 16
    results["envpool_hopper_steps_per_s"] = measure_scan(
        make(EnvConfig(id="envpool/Hopper-v5", num_envs=hopper_envs)), 200 if quick else 1000, repeats
    )
    mjx_mode = {}
    if args.mjx or not quick:
        results["mjx_hopper_steps_per_s"] = measure_mjx()
        mjx_mode = {"mjx_hopper_quick": quick}
    write_result("env_throughput", {
        "quick": quick, **mjx_mode,
        "atari_envs": n, "gymnax_envs": gymnax_envs, "envpool_hopper_envs": hopper_envs, "mjx_hopper_envs": mjx_envs,
        **{k: round(v, 4) if "over" in k else round(v, 1) for k, v in results.items()},
    }, headline=headline)


def headline(result: dict) -> list[Headline]:
    """The report's rows: each back end beside its raw one, with the module docstring's targets."""
    r = result
    rows = []
    if "envpool_xla_over_python" in r:  # the EnvPool and gymnax parts, which --only-mjx leaves out
        rows += [
            Headline(f"Pong env steps/s, our EnvPool XLA wrapper in a jitted scan vs EnvPool's Python loop "
                     f"({r['atari_envs']} envs)",
                     r["envpool_pong_xla_steps_per_s"], r["envpool_pong_python_steps_per_s"],
                     r["envpool_xla_over_python"], Target.on(r, "envpool_xla_over_python", ">=", 0.95)),
            Headline("Pong env steps/s, papers' modifications (score hidden, no episode ends) vs plain",
                     r["envpool_pong_modified_steps_per_s"], r["envpool_pong_xla_steps_per_s"],
                     r["atari_modified_over_plain"], Target.on(r, "atari_modified_over_plain", ">=", 0.95)),
            Headline(f"CartPole env steps/s, our protocol vs gymnax's own vmapped step ({r['gymnax_envs']} envs)",
                     r["gymnax_cartpole_steps_per_s"], r["gymnax_cartpole_raw_steps_per_s"],
                     r["gymnax_ours_over_raw"]),
            Headline(f"Hopper env steps/s, EnvPool through a host callback ({r['envpool_hopper_envs']} envs)",
                     r["envpool_hopper_steps_per_s"]),
        ]
    if "mjx_hopper_steps_per_s" in r:  # not measured by --quick without --mjx
        mode = " --quick" if r.get("mjx_hopper_quick") and not r.get("quick") else ""  # a full file, MJX quick
        rows.append(Headline(f"Hopper env steps/s, MJX ({r['mjx_hopper_envs']} envs{mode})", r["mjx_hopper_steps_per_s"]))
    return rows


if __name__ == "__main__":
    main()
