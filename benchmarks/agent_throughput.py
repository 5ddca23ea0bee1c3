"""Training throughput of the agents: env steps per second, whole runs compiled, seeds vmapped.

    python -m benchmarks.agent_throughput [--quick] [--only PART ...]

* CartPole with 1, 8 and 64 seeds vmapped in one program, for A2C, DQN and ACER
  (discrete), and Pendulum likewise for TRPO (``trpo_pendulum_*``);
* ``a2c_cartpole_64seeds_over_sb3``: our A2C with 64 seeds over Stable-Baselines3's A2C
  (32 environments), timed alternately (target >= 100);
* ``a2c_pong_over_sb3``: our A2C (Nature CNN, 16 EnvPool copies, driven as ``rlhf-jax
  train`` drives it) over SB3's A2C with its Nature-CNN policy on the same EnvPool game
  through a small ``VecEnv`` adapter (target >= 1.5);
* ``a2c_pong_over_raw_env``: the same training over raw EnvPool stepping with the same
  number of environments (target >= 0.8 on CPU). Also the time of each part of one update,
  so the ceiling on 2 cores can be read off: env steps and the network's passes share the cores.
* ``a2c_pong_network_over_sb3``: the network's arithmetic of one such update alone (five
  acting passes over 16 frames, one gradient over the 80), ours over SB3's own policy on the
  same frames: how much of the whole run's ratio is the network's kernels.
* ``pong_training``: A2C, DQN and ACER at the papers' Pong configs
  (``configs/paper/atari/pong_{a2c,dqn,acer}.yaml``), one chunk of each as ``rlhf-jax train``
  runs it, learning from the first step: the rates the Pong experiment's lines train at.

Each "over" is timed side by side in one run (:func:`benchmarks.common.side_by_side`: the
two alternate over 5 rounds, compiling excluded; medians, [min, max] and the load stored).
SB3 is optional: without it one line says so and our figures are still written.
``--only PART`` (seeds, sb3_cartpole, pong, pong_training, atari_gradients) measures some parts, each short enough to time
on a paused machine, and keeps the stored result's other figures.

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

import dataclasses
from typing import Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import (Headline, Side, Target, compiled_chunk, enable_compilation_cache, on_cpu, parse_parts, ratio,
                               side_by_side, stacked_runners, steps_per_second, write_result)
from benchmarks.env_throughput import envpool_python_side
from rlhf_jax import replay
from rlhf_jax.agents import a2c, acer, dqn, trpo
from rlhf_jax.config import ExperimentConfig, RunConfig, load_config
from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.networks import apply_time_major
from rlhf_jax.driver import Driver

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


def training_side(agent, config, env_config: EnvConfig, seeds: int, env_steps: int) -> Side:
    """A whole run's iterations as one compiled program with the seeds vmapped; each run carries
    on from the last one's runners. Units: env steps summed over seeds."""
    env = make(env_config)
    config = dataclasses.replace(config, total_env_steps=env_steps)
    runners = stacked_runners(jax.jit(lambda key: agent.init_runner(key, config, env)), seeds)
    iterations = agent.num_iterations(config, env)
    chunk = compiled_chunk(agent, config, env, iterations)

    def run():
        nonlocal runners
        runners = jax.block_until_ready(chunk(runners)[0])

    return Side(run, iterations * agent.env_steps_per_iteration(config, env) * seeds)


def measure_training(agent, config, env_config: EnvConfig, seeds: int, env_steps: int, repeats: int) -> float:
    """Env steps per second (summed over seeds) of :func:`training_side`, compiling excluded."""
    side = training_side(agent, config, env_config, seeds, env_steps)
    side.run()  # compile
    return steps_per_second(side.run, side.units, repeats)


def command_training_side(config: ExperimentConfig) -> Side:
    """One chunk as ``rlhf-jax train`` runs it (its loop, its compiled code). Units: env steps."""
    driver = Driver(config)
    runner = driver.init(jax.random.PRNGKey(config.seed))

    def run():
        nonlocal runner
        runner, metrics, _ = driver.run_chunk(runner, 0)
        jax.block_until_ready(metrics)

    return Side(run, driver.loop.chunk_length(0) * driver.loop.steps_per_iteration)


PONG_TRAINING = {  # agent: (iterations a timed chunk, the overrides that make it learn from the first step)
    "a2c": (20, ()),
    "dqn": (20, ("dqn.replay_start=0",)),
    "acer": (5, ("acer.replay_start=0",)),
}
# Untimed chunks first, then the best of at least so many timed ones. On a CPU ACER compiles one
# program per drawn count of updates when it first meets it (rlhf_jax.dispatch.repeat_drawn):
# after 20 iterations few counts are new, and a chunk that met one is not the one kept.
PONG_WARM_CHUNKS = {"a2c": 1, "dqn": 1, "acer": 4}
PONG_TIMED_AT_LEAST = {"a2c": 1, "dqn": 1, "acer": 3}


def pong_training(repeats: int) -> dict:
    """Env steps/s of each agent's Pong run at its paper config, one chunk of a few iterations as
    ``rlhf-jax train`` runs it (compiling excluded), learning and replaying from the first step.
    ACER's figure moves with the updates its iterations draw (1 + K, K ~ Poisson(4): 25 +- 4.5 in
    a chunk of 5), the best of 3 chunks taking the one that drew fewest."""
    results = {}
    for agent, (iterations, overrides) in PONG_TRAINING.items():
        path = f"configs/paper/atari/pong_{agent}.yaml"
        probe = Driver(load_config(ExperimentConfig, path, list(overrides)))
        chunk = iterations * probe.loop.steps_per_iteration
        side = command_training_side(load_config(ExperimentConfig, path, [*overrides, f"run.chunk_env_steps={chunk}"]))
        for _ in range(PONG_WARM_CHUNKS[agent]):  # compile
            side.run()
        best_of = max(repeats, PONG_TIMED_AT_LEAST[agent])
        results[f"{agent}_pong_training_steps_per_s"] = rate = steps_per_second(side.run, side.units, best_of)
        print(f"{agent} on Pong ({path}): {rate:,.0f} env steps/s", flush=True)
    return results


class NetworkWork(NamedTuple):
    """Our A2C network's arithmetic in one update, each part blocking until done: ``num_steps``
    acting passes over the copies' frames, and one gradient over the rollout's frames (time-major,
    through :func:`apply_time_major`, as the loss runs them)."""

    acting: Callable[[], None]
    gradient: Callable[[], None]


def network_work(config: a2c.A2CConfig, env_config: EnvConfig) -> NetworkWork:
    env = make(env_config)
    network = a2c.ActorCritic(env.spec, config)
    # Random frames, passed as arguments: XLA would fold constants.
    frames = jnp.asarray(np.random.default_rng(0).integers(
        0, 256, (config.num_steps, env_config.num_envs, *env.spec.observation_shape), dtype=np.uint8))
    params = network.init(jax.random.PRNGKey(0), frames[0])
    act = jax.jit(network.apply)
    grad = jax.jit(jax.grad(lambda p, x: sum(y.sum() for y in apply_time_major(network.apply, p, x))))

    def acting():
        for step in range(config.num_steps):
            jax.block_until_ready(act(params, frames[step]))

    return NetworkWork(acting, lambda: jax.block_until_ready(grad(params, frames)))


def network_milliseconds(config: a2c.A2CConfig, env_config: EnvConfig, repeats: int) -> dict:
    """The network's share of one A2C update: num_steps acting passes and one gradient."""
    work = network_work(config, env_config)
    work.acting()  # compile both before timing
    work.gradient()
    return {"acting_ms_per_update": 1e3 / steps_per_second(work.acting, 1, repeats),
            "gradient_ms_per_update": 1e3 / steps_per_second(work.gradient, 1, repeats)}


def network_side(config: a2c.A2CConfig, env_config: EnvConfig, updates: int) -> Side:
    """:func:`network_work`'s acting and gradient, ``updates`` times. Units: env steps."""
    work = network_work(config, env_config)

    def run():
        for _ in range(updates):
            work.acting(), work.gradient()

    return Side(run, updates * config.num_steps * env_config.num_envs)


# The Nature CNN's forward pass on one 84x84x4 frame, counted by hand (docs/notes.md): convolutions
# 6.6 + 5.3 + 3.6 MFLOP and the dense layer 3.2; a backward pass costs about twice a forward one.
NATURE_FORWARD_MFLOP = 18.7


def atari_gradient_steps(env_config: EnvConfig, repeats: int) -> dict:
    """One gradient step of each agent's loss on Atari frames, on the batch its paper updates on,
    timed alone (compile excluded): milliseconds, frames through the network forward and backward,
    and the GFLOP/s that makes with the Nature CNN's hand count (ACER's default torso is the 2013
    CNN; the Nature one is set here so that all three run the same network).

    * A2C: n = 5 steps of 16 copies, forward and backward over the 80 frames (in passes of
      :func:`rlhf_jax.networks.apply_time_major`, as its loss runs them; ACER's too);
    * DQN: 32 transitions, forward and backward over o_t, forward of the target network over o_{t+1};
    * ACER: k = 20 steps of 16 copies, forward and backward over the 21 x 16 frames, forward of the
      average network over 20 x 16.
    """
    env = make(env_config)
    spec, n = env.spec, env_config.num_envs
    frames_rng = np.random.default_rng(0)

    def frames(*lead):
        return jnp.asarray(frames_rng.integers(0, 256, (*lead, *spec.observation_shape), dtype=np.uint8))

    def zeros(*shape, dtype=jnp.float32):
        return jnp.zeros(shape, dtype)

    def timed(name: str, grad_fn, inputs: tuple, forward_frames: int, backward_frames: int) -> dict:
        # Parameters and frames are arguments, never closed over: XLA would fold constants.
        step = jax.jit(grad_fn)
        jax.block_until_ready(step(*inputs))
        ms = 1e3 / steps_per_second(lambda: jax.block_until_ready(step(*inputs)), 1, repeats)
        gflop = NATURE_FORWARD_MFLOP * (forward_frames + 2 * backward_frames) / 1e3
        print(f"{name}: {ms:.1f} ms a gradient step, {forward_frames} frames forward, {backward_frames} "
              f"backward, {gflop / ms * 1e3:.0f} GFLOP/s", flush=True)
        return {f"{name}_gradient_step_ms": ms, f"{name}_gradient_step_gflop_per_s": gflop / ms * 1e3}

    key = jax.random.PRNGKey(0)
    results = {}
    a2c_config = a2c.A2CConfig(network="nature")
    a2c_net = a2c.ActorCritic(spec, a2c_config)
    a2c_frames = frames(a2c_config.num_steps, n)  # time-major, as the loss takes them
    a2c_params = a2c_net.init(key, a2c_frames[0])
    a2c_outputs = lambda p, x: sum(y.sum() for y in apply_time_major(a2c_net.apply, p, x))
    a2c_batch = a2c_config.num_steps * n
    results.update(timed("a2c", jax.grad(a2c_outputs), (a2c_params, a2c_frames), a2c_batch, a2c_batch))

    dqn_config = dqn.DQNConfig()
    batch_size = dqn_config.batch_size
    q_net = dqn.QNetwork(spec, dqn_config)
    batch = replay.Batch(obs=frames(batch_size), action=zeros(batch_size, dtype=jnp.int32), reward=zeros(batch_size),
                         terminated=zeros(batch_size, dtype=bool), truncated=zeros(batch_size, dtype=bool),
                         action_ignored=zeros(batch_size, dtype=bool), next_obs=frames(batch_size),
                         final_obs=frames(batch_size), mask=jnp.ones(batch_size, bool))
    q_params = q_net.init(key, batch.obs[:1])
    dqn_loss = dqn.make_loss(dqn_config, spec)
    results.update(timed("dqn", jax.grad(lambda p, target, b: dqn_loss(p, target, b, b.reward)[0]),
                         (q_params, q_params, batch), 2 * batch_size, batch_size))

    acer_config = acer.ACERConfig(network="nature")
    k = acer_config.num_steps
    trajectories = acer.Trajectories(
        obs=frames(k + 1, n), action=zeros(k, n, dtype=jnp.int32), reward=zeros(k, n),
        terminated=zeros(k, n, dtype=bool), truncated=zeros(k, n, dtype=bool), action_ignored=zeros(k, n, dtype=bool),
        final_obs=None, behaviour=jnp.full((k, n, spec.action_space.n), -jnp.log(spec.action_space.n)))
    acer_params = acer.make_network(acer_config, spec).init(key, trajectories.obs[0])
    acer_loss = acer.make_loss(acer_config, spec)
    results.update(timed("acer", jax.grad(lambda p, average, b: acer_loss(p, average, b, key)[0]),
                         (acer_params, acer_params, trajectories), (2 * k + 1) * n, (k + 1) * n))
    return results


def sb3_a2c_side(config: a2c.A2CConfig, env_steps: int, vec_env=None, torch_threads: int | None = None) -> Side | str:
    """Stable-Baselines3's A2C learning ``env_steps`` steps per run, with our A2C's settings where
    SB3 has them (n-step, gamma, entropy and value weights, RMSprop, gradient clip); on
    Gymnasium's CartPole with ``CARTPOLE_ENVS`` environments unless ``vec_env`` is given
    (then a CNN policy: SB3's NatureCNN). Or why there is none (SB3 missing).

    ``torch_threads``: torch's intra-op threads while SB3 learns (restored after each run;
    None: torch's default). On CartPole's 64-unit MLP one thread was SB3's faster setting on
    2 busy cores: alternated, 0.8-3.2k steps/s with torch's default 2 threads against 6.5-16k
    with 1 (the two threads wait on each other while other jobs hold the cores)."""
    try:
        from stable_baselines3.common.env_util import make_vec_env
    except Exception as error:  # ImportError, or a version clash inside it
        return f"stable-baselines3 not importable ({type(error).__name__}: {error})"
    if vec_env is None:
        model = sb3_a2c_model(config, make_vec_env("CartPole-v1", n_envs=CARTPOLE_ENVS, seed=0), "MlpPolicy")
    else:
        model = sb3_a2c_model(config, vec_env, "CnnPolicy")

    def run():
        import torch

        previous = torch.get_num_threads()
        torch.set_num_threads(torch_threads or previous)
        try:
            model.learn(total_timesteps=env_steps, reset_num_timesteps=False)
        finally:
            torch.set_num_threads(previous)

    return Side(run, env_steps)


def sb3_a2c_model(config: a2c.A2CConfig, vec_env, policy: Literal["MlpPolicy", "CnnPolicy"]):
    """SB3's A2C on ``vec_env`` with our A2C's settings where SB3 has them (n-step, gamma, entropy
    and value weights, RMSprop, gradient clip); ``CnnPolicy`` is SB3's NatureCNN.

    The CNN goes on a GPU where torch sees one, as ours goes on JAX's default device; the MLP
    stays on the CPU, where SB3 advises running it."""
    from stable_baselines3 import A2C

    device = "cpu" if policy == "MlpPolicy" else "auto"
    return A2C(policy, vec_env, n_steps=config.num_steps, learning_rate=config.learning_rate, gamma=config.gamma,
               ent_coef=config.entropy_coef, vf_coef=config.value_coef, max_grad_norm=config.max_grad_norm,
               rms_prop_eps=config.rms_eps, device=device, seed=0)


def sb3_network_side(config: a2c.A2CConfig, vec_env, updates: int) -> Side | str:
    """The same arithmetic through SB3's own A2C policy (its NatureCNN and heads, torch's default
    threads, as its A2C learns), ``updates`` times: ``n_steps`` acting passes under ``no_grad``,
    then ``evaluate_actions`` and a backward pass over the rollout's frames. Or why there is none."""
    try:
        import torch

        model = sb3_a2c_model(config, vec_env, "CnnPolicy")
    except Exception as error:  # ImportError, or a version clash inside it
        return f"stable-baselines3 not importable ({type(error).__name__}: {error})"
    policy, n = model.policy, vec_env.num_envs
    frames = torch.as_tensor(np.random.default_rng(0).integers(
        0, 256, (config.num_steps * n, *vec_env.observation_space.shape), dtype=np.uint8), device=policy.device)
    actions = torch.zeros(config.num_steps * n, dtype=torch.long, device=policy.device)

    def run():
        for _ in range(updates):
            with torch.no_grad():
                for step in range(config.num_steps):
                    policy(frames[step * n:(step + 1) * n])
            values, log_prob, entropy = policy.evaluate_actions(frames, actions)
            policy.zero_grad()
            (values.sum() + log_prob.sum() + entropy.sum()).backward()
        if frames.is_cuda:  # CUDA kernels run asynchronously: the round ends when they have
            torch.cuda.synchronize()

    return Side(run, updates * config.num_steps * n)


def envpool_vec_env(task: str, num_envs: int):
    """EnvPool's ``task`` as an SB3 ``VecEnv`` (:mod:`benchmarks.sb3_envpool`), its rewards unclipped
    as ours are."""
    from benchmarks.sb3_envpool import EnvPoolVecEnv

    return EnvPoolVecEnv(task, num_envs, seed=0, reward_clip=False)


PARTS = ("seeds", "sb3_cartpole", "pong", "pong_training", "atari_gradients")


def main() -> None:
    quick, parts, merge, repeats, rounds = parse_parts(__doc__.split("\n\n")[0], PARTS)
    enable_compilation_cache()
    results: dict = {}

    cartpole = EnvConfig(id="gymnax/CartPole-v1", num_envs=CARTPOLE_ENVS)
    steps = 2_048 if quick else 65_536
    seed_counts = (1, 8, 64) if "seeds" in parts else ()
    for name, (agent, config) in agent_setups().items():
        if quick and name == "dqn":
            config = dataclasses.replace(config, replay_start=512)
        for seeds in seed_counts:
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
        for seeds in seed_counts:
            results[f"{name}_{seeds}seeds_steps_per_s"] = measure_training(
                agent, config, env_config, seeds, env_steps, repeats
            )

    if "sb3_cartpole" in parts:
        # 64 seeds of ours beside SB3, alternating; each side about 10 s a round on 2 cores.
        # SB3 on one torch thread: its fastest for this small MLP (see sb3_a2c_side).
        ours = training_side(a2c, A2C_CARTPOLE, cartpole, 64, steps)
        peer = sb3_a2c_side(A2C_CARTPOLE, 5_000 if quick else 50_000, torch_threads=1)
        if isinstance(peer, str):
            print(f"{peer}: no SB3 A2C timed", flush=True)
        else:
            results.update(side_by_side(ours, peer, rounds, "A2C CartPole: ours 64 seeds vs SB3").fields(
                "a2c_cartpole_64seeds_paired_steps_per_s", "sb3_a2c_cartpole_steps_per_s", "a2c_cartpole_64seeds_over_sb3"))

    if "pong" in parts:
        pong_envs = 16
        pong_iterations = 10 if quick else 100
        pong_a2c = a2c.A2CConfig(network="nature", reward_clip=1.0)  # SB3's CnnPolicy is the Nature CNN too
        steps_per_iteration = pong_a2c.num_steps * pong_envs
        pong = ExperimentConfig(
            agent="a2c", env=EnvConfig(id="envpool/Pong-v5", num_envs=pong_envs),
            a2c=dataclasses.replace(pong_a2c, total_env_steps=10 * pong_iterations * steps_per_iteration),
            run=RunConfig(chunk_env_steps=pong_iterations * steps_per_iteration),
        )
        trained = command_training_side(pong)
        raw = envpool_python_side("Pong-v5", pong_envs, 5 * pong_iterations)
        against_raw = side_by_side(trained, raw, rounds, "A2C Pong: training vs raw EnvPool")
        results.update(against_raw.fields("a2c_pong_steps_per_s", "envpool_pong_raw_steps_per_s",
                                          "a2c_pong_over_raw_env"))
        parts_ms = network_milliseconds(pong.a2c, pong.env, repeats)
        results["pong_env_ms_per_update"] = round(1e3 * steps_per_iteration / against_raw.peer.median, 1)
        results.update({f"pong_{k}": round(v, 1) for k, v in parts_ms.items()})
        sb3 = sb3_a2c_side(pong.a2c, pong_iterations * steps_per_iteration, envpool_vec_env("Pong-v5", pong_envs))
        if isinstance(sb3, str):
            print(f"{sb3}: no SB3 A2C timed on Pong", flush=True)
        else:
            results.update(side_by_side(trained, sb3, rounds, "A2C Pong: ours vs SB3").fields(
                "a2c_pong_paired_steps_per_s", "sb3_a2c_pong_steps_per_s", "a2c_pong_over_sb3"))
        # The network alone, ours against SB3's policy on the same frames: what the whole run's
        # ratio would be if nothing but the network's arithmetic counted.
        network_updates = 2 if quick else 20  # about a second a side
        sb3_network = sb3_network_side(pong.a2c, envpool_vec_env("Pong-v5", pong_envs), network_updates)
        if not isinstance(sb3_network, str):
            results.update(side_by_side(network_side(pong.a2c, pong.env, network_updates), sb3_network, rounds,
                                        "A2C Pong network: ours vs SB3's policy").fields(
                "a2c_pong_network_steps_per_s", "sb3_pong_network_steps_per_s", "a2c_pong_network_over_sb3"))
        results["pong_envs"] = pong_envs

    if "pong_training" in parts:
        results.update(pong_training(repeats))

    if "atari_gradients" in parts:
        results.update(atari_gradient_steps(EnvConfig(id="envpool/Pong-v5", num_envs=16), repeats))

    write_result("agent_throughput", {
        "quick": quick, "cartpole_envs": CARTPOLE_ENVS, "pendulum_envs": CARTPOLE_ENVS, "parts": list(parts),
        **{k: (round(v, 4) if "over" in k else round(v, 1)) if isinstance(v, float) else v for k, v in results.items()},
    }, headline=headline, merge=merge)


def headline(result: dict) -> list[Headline]:
    """The report's rows: the module docstring's two targets, then each agent's 64 seeds over 1."""
    r, envs = result, result["cartpole_envs"]
    rows = [
        # The SB3 figures are missing where stable-baselines3 is not installed.
        Headline(f"A2C CartPole env steps/s, 64 seeds vmapped vs Stable-Baselines3 A2C ({envs} envs; alternating)",
                 r.get("a2c_cartpole_64seeds_paired_steps_per_s"), r.get("sb3_a2c_cartpole_steps_per_s"),
                 r.get("a2c_cartpole_64seeds_over_sb3"), Target.on(r, "a2c_cartpole_64seeds_over_sb3", ">=", 100.0)),
        Headline(f"A2C Pong training env steps/s, Nature CNN, vs Stable-Baselines3 A2C ({r['pong_envs']} envs; "
                 f"alternating)", r.get("a2c_pong_paired_steps_per_s"), r.get("sb3_a2c_pong_steps_per_s"),
                 r.get("a2c_pong_over_sb3"), Target.on(r, "a2c_pong_over_sb3", ">=", 1.5)),
        Headline(f"A2C Pong network alone (acting and gradient of one update), env steps/s, vs SB3's policy "
                 f"({r['pong_envs']} envs; alternating)", r.get("a2c_pong_network_steps_per_s"),
                 r.get("sb3_pong_network_steps_per_s"), r.get("a2c_pong_network_over_sb3")),
        Headline(f"A2C Pong training env steps/s vs raw EnvPool stepping ({r['pong_envs']} envs)",
                 r["a2c_pong_steps_per_s"], r["envpool_pong_raw_steps_per_s"], r["a2c_pong_over_raw_env"],
                 # A CPU's target: there the network and the pool share the cores.
                 Target.on(r, "a2c_pong_over_raw_env", ">=", 0.8) if on_cpu(r) else None),
    ]
    for agent, task in (("a2c", "CartPole"), ("dqn", "CartPole"), ("acer", "CartPole"), ("trpo", "Pendulum")):
        one, many = (r.get(f"{agent}_{task.lower()}_{seeds}seeds_steps_per_s") for seeds in (1, 64))
        if one is None:  # a run of --only pong with no stored result to merge into
            continue
        rows.append(Headline(f"{agent.upper()} {task} env steps/s, 64 seeds vs 1 seed ({envs} envs each)",
                             many, one, ratio(many, one)))
    return rows


if __name__ == "__main__":
    main()
