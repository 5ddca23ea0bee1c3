"""Training throughput of the agents: env steps per second, whole runs compiled, seeds vmapped.

    python benchmarks/agent_throughput.py [--quick]

* CartPole with 1, 8 and 64 seeds vmapped in one program, for A2C, DQN and ACER
  (discrete), and Pendulum likewise for TRPO (``trpo_pendulum_*``);
* ``a2c_cartpole_64seeds_over_sb3``: our A2C with 64 seeds over Stable-Baselines3's A2C
  on the same machine and budget (when ``stable-baselines3`` is installed; target >= 50);
* ``a2c_pong_over_raw_env``: A2C training on Pong through EnvPool's XLA interface, driven
  as ``rlhf-jax train`` drives it, over raw EnvPool stepping with the same number of
  environments (target >= 0.8 on CPU). Also the time of each part of one update, so the
  ceiling on 2 cores can be read off: env steps and the network's passes share the cores.

Every seed count runs the same env steps per seed (``--quick``: 2,048, with DQN learning
and ACER replaying from step 512 or 640 so that the short run times its learning phase;
full: 65,536). TRPO takes whole iterations of configs/trpo_pendulum.yaml's 6,400 env steps
(32 environments x one 200-step Pendulum episode each): ``--quick`` one iteration
(6,400 env steps per seed), full 10 (64,000).

Seeds are initialised one at a time, outside the timed program, and only the iterations are
vmapped (as ``scaling.py`` does). On CPU, jax/jaxlib 0.10.2 deadlocked running
``jax.jit(jax.vmap(train))`` when ``train`` made several orthogonal initialisations (batched
LAPACK QRs; TRPO and ACER do): TRPO on Pendulum with 8 or 64 seeds sat idle in
``block_until_ready`` for good, even with XLA's concurrency-optimised scheduler turned off.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp

from benchmarks.common import (Headline, Target, compiled_chunk, enable_compilation_cache, ratio, stacked_runners,
                               steps_per_second, write_result)
from benchmarks.env_throughput import measure_envpool_python
from rlhf_jax.agents import a2c, acer, dqn, trpo
from rlhf_jax.config import ExperimentConfig, RunConfig
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.trainer import Training

# The settings that solve CartPole (configs/a2c_cartpole.yaml).
A2C_CARTPOLE = a2c.A2CConfig(num_steps=8, learning_rate=3e-3)
CARTPOLE_ENVS = 32


def agent_setups():
    """name -> (agent module, config on CartPole), the settings of configs/*_cartpole.yaml."""
    cartpole_dqn = dqn.DQNConfig(replay_capacity=200_000, replay_start=2_000, exploration_steps=20_000,
                                 epsilon_end=0.05, target_update_period=250, learning_rate=1e-3,
                                 batch_size=128, huber_delta=10.0)
    return {"a2c": (a2c, A2C_CARTPOLE), "dqn": (dqn, cartpole_dqn)}


def trust_region_setups():
    """name -> (agent module, config, env id): ACER (discrete) on CartPole with the settings of
    configs/acer_cartpole.yaml, TRPO on Pendulum with those of configs/trpo_pendulum.yaml.
    Both run ``CARTPOLE_ENVS`` (32) environments per seed, as the agents above do
    (acer_cartpole.yaml itself runs 16)."""
    return {
        "acer_cartpole": (acer, acer.ACERConfig(learning_rate=2e-3, replay_capacity=32_000, replay_start=3_200),
                          "gymnax/CartPole-v1"),
        "trpo_pendulum": (trpo, trpo.TRPOConfig(batch_size=6_400, reward_scale=0.1), "gymnax/Pendulum-v1"),
    }


def measure_training(agent, config, env_config: EnvConfig, seeds: int, env_steps: int, repeats: int) -> float:
    """Env steps per second (summed over seeds) of a whole run's iterations, one compiled
    program with the seeds vmapped; each timed call carries on from the last one's runners."""
    env = make(env_config)
    config = dataclasses.replace(config, total_env_steps=env_steps)
    runners = stacked_runners(jax.jit(lambda key: agent.init_runner(key, config, env)), seeds)
    iterations = agent.num_iterations(config, env)
    chunk = compiled_chunk(agent, config, env, iterations)
    runners = jax.block_until_ready(chunk(runners)[0])  # compile

    def run():
        nonlocal runners
        runners = jax.block_until_ready(chunk(runners)[0])

    return steps_per_second(run, iterations * agent.env_steps_per_iteration(config, env) * seeds, repeats)


def measure_command_training(config: ExperimentConfig, repeats: int) -> float:
    """Env steps per second of one chunk as ``rlhf-jax train`` runs it (its loop, its compiled code)."""
    training = Training(config)
    runner = training.init_runner(jax.random.PRNGKey(config.seed))
    runner, _ = jax.block_until_ready(training.run_chunk(runner, 0))  # compile

    def run():
        nonlocal runner
        runner, metrics = training.run_chunk(runner, 0)
        jax.block_until_ready(metrics)

    return steps_per_second(run, training.chunk_length(0) * training.steps_per_iteration, repeats)


def network_milliseconds(config: a2c.A2CConfig, env_config: EnvConfig, repeats: int) -> dict:
    """The network's share of one A2C update: num_steps acting passes and one gradient."""
    env = make(env_config)
    network = a2c.ActorCritic(env.spec, config)
    batch = config.num_steps * env_config.num_envs
    frames = jnp.zeros((batch, *env.spec.observation_shape), env.spec.observation_dtype)
    params = network.init(jax.random.PRNGKey(0), frames[:1])
    act = jax.jit(lambda p, x: network.apply(p, x))
    grad = jax.jit(jax.grad(lambda p, x: sum(y.sum() for y in network.apply(p, x))))
    act_frames = frames[: env_config.num_envs]
    jax.block_until_ready((act(params, act_frames), grad(params, frames)))
    acting = 1e3 / steps_per_second(lambda: jax.block_until_ready(act(params, act_frames)), 1, repeats)
    gradient = 1e3 / steps_per_second(lambda: jax.block_until_ready(grad(params, frames)), 1, repeats)
    return {"acting_ms_per_update": config.num_steps * acting, "gradient_ms_per_update": gradient}


def measure_sb3_a2c(env_steps: int) -> float | None:
    """Stable-Baselines3's A2C on Gymnasium's CartPole, same number of environments."""
    try:
        from stable_baselines3 import A2C
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError:
        return None
    vec_env = make_vec_env("CartPole-v1", n_envs=CARTPOLE_ENVS, seed=0)
    model = A2C("MlpPolicy", vec_env, n_steps=A2C_CARTPOLE.num_steps, learning_rate=A2C_CARTPOLE.learning_rate,
                device="cpu", seed=0)
    model.learn(total_timesteps=CARTPOLE_ENVS * A2C_CARTPOLE.num_steps)  # warm-up
    start = time.perf_counter()
    model.learn(total_timesteps=env_steps)
    return env_steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small budgets: under a minute on 2 CPU cores")
    args = parser.parse_args()
    enable_compilation_cache()
    quick = args.quick
    repeats = 1 if quick else 3
    results: dict = {}

    cartpole = EnvConfig(id="gymnax/CartPole-v1", num_envs=CARTPOLE_ENVS)
    steps = 2_048 if quick else 65_536
    for name, (agent, config) in agent_setups().items():
        if quick and name == "dqn":
            config = dataclasses.replace(config, replay_start=512)
        for seeds in (1, 8, 64):
            results[f"{name}_cartpole_{seeds}seeds_steps_per_s"] = measure_training(
                agent, config, cartpole, seeds, steps, repeats
            )

    for name, (agent, config, env_id) in trust_region_setups().items():
        env_config = EnvConfig(id=env_id, num_envs=CARTPOLE_ENVS)
        env_steps = steps
        if agent is acer and quick:
            # One iteration (32 x 20 env steps) fills the memory enough to replay from the second on.
            config = dataclasses.replace(config, replay_start=640)
        if agent is trpo:
            env_steps = (1 if quick else 10) * config.batch_size
        for seeds in (1, 8, 64):
            results[f"{name}_{seeds}seeds_steps_per_s"] = measure_training(
                agent, config, env_config, seeds, env_steps, repeats
            )

    sb3 = measure_sb3_a2c(5_000 if quick else 50_000)
    if sb3 is not None:
        results["sb3_a2c_cartpole_steps_per_s"] = sb3
        results["a2c_cartpole_64seeds_over_sb3"] = results["a2c_cartpole_64seeds_steps_per_s"] / sb3

    pong_envs = 16
    pong_iterations = 10 if quick else 100
    steps_per_iteration = a2c.A2CConfig().num_steps * pong_envs
    pong = ExperimentConfig(
        agent="a2c", env=EnvConfig(id="envpool/Pong-v5", num_envs=pong_envs),
        a2c=a2c.A2CConfig(total_env_steps=10 * pong_iterations * steps_per_iteration, reward_clip=1.0),
        run=RunConfig(chunk_env_steps=pong_iterations * steps_per_iteration),
    )
    raw, trained = [], []
    for _ in range(1 if quick else 3):  # interleaved, so load on the machine hits both alike
        raw.append(measure_envpool_python("Pong-v5", pong_envs, 5 * pong_iterations, repeats))
        trained.append(measure_command_training(pong, repeats))
    parts = network_milliseconds(pong.a2c, pong.env, repeats)
    results["pong_env_ms_per_update"] = 1e3 * steps_per_iteration / max(raw)
    results.update({f"pong_{k}": v for k, v in parts.items()})
    results["envpool_pong_raw_steps_per_s"] = max(raw)
    results["a2c_pong_steps_per_s"] = max(trained)
    results["a2c_pong_over_raw_env"] = max(trained) / max(raw)

    write_result("agent_throughput", {
        "quick": quick, "cartpole_envs": CARTPOLE_ENVS, "pendulum_envs": CARTPOLE_ENVS, "pong_envs": pong_envs,
        **{k: round(v, 4) if "over" in k else round(v, 1) for k, v in results.items()},
    }, headline=headline)


def headline(result: dict) -> list[Headline]:
    """The report's rows: the module docstring's two targets, then each agent's 64 seeds over 1."""
    r, envs = result, result["cartpole_envs"]
    rows = [
        # The SB3 figures are missing where stable-baselines3 is not installed.
        Headline(f"A2C CartPole env steps/s, 64 seeds vmapped vs Stable-Baselines3 A2C ({envs} envs)",
                 r["a2c_cartpole_64seeds_steps_per_s"], r.get("sb3_a2c_cartpole_steps_per_s"),
                 r.get("a2c_cartpole_64seeds_over_sb3"), Target.on(r, "a2c_cartpole_64seeds_over_sb3", ">=", 50.0)),
        Headline(f"A2C Pong training env steps/s vs raw EnvPool stepping ({r['pong_envs']} envs)",
                 r["a2c_pong_steps_per_s"], r["envpool_pong_raw_steps_per_s"], r["a2c_pong_over_raw_env"],
                 Target.on(r, "a2c_pong_over_raw_env", ">=", 0.8)),  # the target is for CPU
    ]
    for agent, task in (("a2c", "CartPole"), ("dqn", "CartPole"), ("acer", "CartPole"), ("trpo", "Pendulum")):
        one, many = (r[f"{agent}_{task.lower()}_{seeds}seeds_steps_per_s"] for seeds in (1, 64))
        rows.append(Headline(f"{agent.upper()} {task} env steps/s, 64 seeds vs 1 seed ({envs} envs each)",
                             many, one, ratio(many, one)))
    return rows


if __name__ == "__main__":
    main()
