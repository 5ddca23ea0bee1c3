"""Training throughput of the agents: env steps per second, whole runs compiled, seeds vmapped.

    python benchmarks/agent_throughput.py [--quick]

* CartPole with 1, 8 and 64 seeds vmapped in one program, for each agent;
* ``a2c_cartpole_64seeds_over_sb3``: our A2C with 64 seeds over Stable-Baselines3's A2C
  on the same machine and budget (when ``stable-baselines3`` is installed; target >= 50);
* ``a2c_pong_over_raw_env``: A2C training on Pong through EnvPool's XLA interface over
  raw EnvPool stepping with the same number of environments (target >= 0.8 on CPU).
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import jax

from benchmarks.common import enable_compilation_cache, steps_per_second, write_result
from benchmarks.env_throughput import measure_envpool_python
from rlhf_jax.agents import a2c, dqn
from rlhf_jax.envs import EnvConfig, make

# The settings that solve CartPole (configs/a2c_cartpole.yaml).
A2C_CARTPOLE = a2c.A2CConfig(num_steps=8, learning_rate=3e-3)
CARTPOLE_ENVS = 32


def agent_setups():
    """name -> (agent module, config on CartPole), the settings of configs/*_cartpole.yaml."""
    cartpole_dqn = dqn.DQNConfig(replay_capacity=200_000, replay_start=2_000, exploration_steps=20_000,
                                 epsilon_end=0.05, target_update_period=250, learning_rate=1e-3,
                                 batch_size=128, huber_delta=10.0)
    return {"a2c": (a2c, A2C_CARTPOLE), "dqn": (dqn, cartpole_dqn)}


def measure_training(agent, config, env_config: EnvConfig, seeds: int, env_steps: int, repeats: int) -> float:
    """Env steps per second (summed over seeds) of whole compiled training runs."""
    env = make(env_config)
    config = dataclasses.replace(config, total_env_steps=env_steps)
    train = agent.make_train(config, env)
    run = jax.jit(jax.vmap(train)) if seeds > 1 else jax.jit(train)
    keys = jax.random.split(jax.random.PRNGKey(0), seeds) if seeds > 1 else jax.random.PRNGKey(0)
    jax.block_until_ready(run(keys))  # compile
    done = agent.num_iterations(config, env) * agent.env_steps_per_iteration(config, env) * seeds
    return steps_per_second(lambda: jax.block_until_ready(run(keys)), done, repeats)


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
    repeats = 2 if quick else 3
    results: dict = {}

    cartpole = EnvConfig(id="gymnax/CartPole-v1", num_envs=CARTPOLE_ENVS)
    for name, (agent, config) in agent_setups().items():
        for seeds in (1, 8, 64):
            steps = 25_600 if quick else 256_000
            results[f"{name}_cartpole_{seeds}seeds_steps_per_s"] = measure_training(
                agent, config, cartpole, seeds, steps, repeats
            )

    sb3 = measure_sb3_a2c(5_000 if quick else 50_000)
    if sb3 is not None:
        results["sb3_a2c_cartpole_steps_per_s"] = sb3
        results["a2c_cartpole_64seeds_over_sb3"] = results["a2c_cartpole_64seeds_steps_per_s"] / sb3

    pong_envs = 16
    pong_iterations = 10 if quick else 100
    pong = EnvConfig(id="envpool/Pong-v5", num_envs=pong_envs)
    a2c_pong = a2c.A2CConfig(total_env_steps=pong_iterations * 5 * pong_envs)
    raw, trained = [], []
    for _ in range(2):  # interleaved, so load on the machine hits both alike
        raw.append(measure_envpool_python("Pong-v5", pong_envs, 5 * pong_iterations, repeats))
        trained.append(measure_training(a2c, a2c_pong, pong, 1, a2c_pong.total_env_steps, repeats))
    results["envpool_pong_raw_steps_per_s"] = max(raw)
    results["a2c_pong_steps_per_s"] = max(trained)
    results["a2c_pong_over_raw_env"] = max(trained) / max(raw)

    write_result("agent_throughput", {
        "quick": quick, "cartpole_envs": CARTPOLE_ENVS, "pong_envs": pong_envs,
        **{k: round(v, 4) if "over" in k else round(v, 1) for k, v in results.items()},
    })


if __name__ == "__main__":
    main()
