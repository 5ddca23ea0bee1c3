"""The preference reward model inside an agent of your own: PPO on CartPole trained on r̂ alone.

The agent here is written in this script (a small PPO in Flax and Optax), as yours would be;
the library supplies the reward model of Christiano et al. 2017 as pure functions:

* ``init_ensemble`` and ``set_input_statistics``: an ensemble of reward predictors, its inputs
  standardised by the untrained policy's steps;
* ``select_queries``: the pairs of segments its members disagree on most (section 2.2.4);
* ``oracle_answers`` and ``add_labels``: a synthetic overseer's answers, kept in the label
  database D;
* ``fit``: Adam steps of every member on the preference loss (equation 1);
* ``update_normalization`` and ``normalized_reward``: r̂, each member normalised, then averaged.

The environment hides episode ends from the agent (the paper's appendix A): a fallen pole
restarts the cart unannounced, and the overseer's reward is 0 on that step, 1 on every other.
The agent never sees that reward; it learns from r̂. Each round the agent trains on the current
r̂, its steps are cut into segments, the overseer answers a few queries about them, and the
ensemble is refitted. The script prints, per round, how often r̂ ranks fresh pairs of segments
as the overseer would, and the agent's true episode return.

    python examples/preferences_in_your_agent.py --rounds 30
"""
from __future__ import annotations

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from rlhf_jax.envs import EnvConfig, make
from rlhf_jax.ops import full_ring
from rlhf_jax.reward import (
    RewardModelConfig,
    Segments,
    TeacherConfig,
    add_labels,
    empty_labels,
    fit,
    init_ensemble,
    member_returns,
    normalized_reward,
    oracle_answers,
    select_queries,
    set_input_statistics,
    take_clips,
    update_normalization,
)

SEGMENT = 25  # steps per segment (half a second of CartPole)


# --------------------------------------------------------------------- your agent: PPO
class ActorCritic(nn.Module):
    actions: int

    @nn.compact
    def __call__(self, obs):
        def torso(x):
            for _ in range(2):
                x = nn.tanh(nn.Dense(64)(x))
            return x

        return nn.Dense(self.actions)(torso(obs)), nn.Dense(1)(torso(obs))[..., 0]


def make_agent(env, steps: int, reward_fn, gamma=0.99, lam=0.95, clip=0.2, epochs=4, minibatches=4, lr=3e-3):
    """``init(key)`` and ``iteration(state, reward_params)``: ``steps`` per environment, then
    ``epochs`` of clipped PPO on the rewards ``reward_fn(reward_params, obs, action)``."""
    network = ActorCritic(env.spec.action_space.n)
    optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(lr))

    def init(key):
        net_key, env_key, key = jax.random.split(key, 3)
        env_state, timestep = env.reset(env_key)
        params = network.init(net_key, timestep.obs)
        return params, optimizer.init(params), env_state, timestep.obs, key

    def step(carry, _):
        params, env_state, obs, key = carry
        key, act_key = jax.random.split(key)
        logits, value = network.apply(params, obs)
        action = jax.random.categorical(act_key, logits)
        env_state, timestep = env.step(env_state, action)
        log_prob = jax.nn.log_softmax(logits)[jnp.arange(action.shape[0]), action]
        return (params, env_state, timestep.obs, key), (obs, action, log_prob, value, timestep)

    def loss(params, obs, action, old_log_prob, advantage, target):
        logits, value = network.apply(params, obs)
        log_prob = jax.nn.log_softmax(logits)[jnp.arange(action.shape[0]), action]
        ratio = jnp.exp(log_prob - old_log_prob)
        policy = -jnp.minimum(ratio * advantage, jnp.clip(ratio, 1 - clip, 1 + clip) * advantage).mean()
        return policy + 0.5 * jnp.square(value - target).mean()

    def iteration(state, reward_params):
        params, opt_state, env_state, obs, key = state
        (_, env_state, last_obs, key), (obs_t, action_t, log_prob_t, value_t, timestep) = jax.lax.scan(
            step, (params, env_state, obs, key), None, steps)
        reward = reward_fn(reward_params, obs_t, action_t)  # [T, N]: r̂, never the overseer's reward
        not_done = 1.0 - timestep.done
        _, last_value = network.apply(params, last_obs)

        def gae(carry, x):  # generalised advantage estimation, backwards in time
            advantage, next_value = carry
            r, v, live = x
            delta = r + gamma * next_value * live - v
            advantage = delta + gamma * lam * live * advantage
            return (advantage, v), advantage

        _, advantage = jax.lax.scan(gae, (jnp.zeros_like(last_value), last_value),
                                    (reward, value_t, not_done), reverse=True)
        target = advantage + value_t
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        batch = tuple(x.reshape(-1, *x.shape[2:]) for x in (obs_t, action_t, log_prob_t, advantage, target))

        def epoch(carry, epoch_key):
            params, opt_state = carry
            order = jax.random.permutation(epoch_key, batch[0].shape[0]).reshape(minibatches, -1)
            for rows in order:  # a few minibatches, unrolled
                grads = jax.grad(loss)(params, *(x[rows] for x in batch))
                updates, opt_state = optimizer.update(grads, opt_state, params)
                params = optax.apply_updates(params, updates)
            return (params, opt_state), None

        key, epoch_key = jax.random.split(key)
        (params, opt_state), _ = jax.lax.scan(epoch, (params, opt_state), jax.random.split(epoch_key, epochs))
        info = timestep.info
        finished = info["true_done"]
        episodes = (finished.sum(), jnp.where(finished, info["episode_return"], 0.0).sum())
        # The overseer's reward rides along for the synthetic labels, as a person's eyes would.
        steps_taken = (obs_t, action_t, timestep.reward)
        return (params, opt_state, env_state, last_obs, key), steps_taken, episodes

    return init, iteration


def cut(obs, action, oracle_reward) -> Segments:
    """Steps ``[I, T, N, ...]`` of ``I`` iterations -> segments of ``SEGMENT`` consecutive steps
    of one environment."""
    def per_env(x):  # [I, T, N, ...] -> [N * (I*T // SEGMENT), SEGMENT, ...]
        x = x.reshape(-1, *x.shape[2:])  # [I*T, N, ...], time in order
        usable = x.shape[0] // SEGMENT * SEGMENT
        x = jnp.moveaxis(x[:usable], 1, 0)  # [N, time, ...]
        return x.reshape(-1, SEGMENT, *x.shape[2:])

    obs, action, oracle_reward = per_env(obs), per_env(action), per_env(oracle_reward)
    return Segments(obs, action, oracle_reward, full_ring(obs.shape[0]))


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="rounds of RL, queries and fitting")
    parser.add_argument("--iterations", type=int, default=4, help="PPO iterations per round")
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=128, help="steps per environment per PPO iteration")
    parser.add_argument("--initial-labels", type=int, default=50)
    parser.add_argument("--labels", type=int, default=15, help="new labels per round")
    parser.add_argument("--fit-steps", type=int, default=100, help="reward-model Adam steps per round")
    parser.add_argument("--members", type=int, default=3, help="reward predictors in the ensemble")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=args.envs, hide_episode_end=True, hidden_end="reset"))
    spec = env.spec
    model = RewardModelConfig(ensemble_size=args.members)
    initial_asks = -(-args.initial_labels // args.labels)  # in batches of --labels
    capacity = (initial_asks + args.rounds) * args.labels

    def reward_fn(ensemble, obs, action):
        return normalized_reward(ensemble, model, spec, obs, action)

    agent_init, agent_iteration = make_agent(env, args.steps, reward_fn)

    @jax.jit
    def play(agent, ensemble):
        """``args.iterations`` PPO iterations on r̂: the agent, the segments of its steps, its episodes."""
        agent, (steps, episodes) = jax.lax.scan(lambda a, _: (lambda a, s, e: (a, (s, e)))(*agent_iteration(a, ensemble)),
                                                agent, None, args.iterations)
        return agent, cut(*steps), (episodes[0].sum(), episodes[1].sum())

    @jax.jit
    def ask(labels, ensemble, segments, key):
        """``args.labels`` queries the members disagree on most, answered by the overseer and stored."""
        query_key, answer_key, store_key = jax.random.split(key, 3)
        returns = lambda obs, action: member_returns(ensemble, model, spec, obs, action).sum(-1)  # [M, P]
        first, second = select_queries(query_key, segments, returns, args.labels)
        mu, answered = oracle_answers(answer_key, segments.oracle_reward[first], segments.oracle_reward[second],
                                      TeacherConfig())
        return add_labels(labels, take_clips(segments, first, second), mu, answered, store_key, model.validation_fraction)

    fit_round = jax.jit(fit, static_argnums=(1, 2, 5))
    normalize = jax.jit(lambda ensemble, segments: update_normalization(ensemble, model, spec, segments.obs,
                                                                        segments.action))

    @jax.jit
    def score(ensemble, segments, key):
        """Share of fresh pairs with unequal true returns that r̂ ranks as the overseer does."""
        first, second = jax.random.randint(key, (2, 512), 0, segments.ring.size)
        predicted = normalized_reward(ensemble, model, spec, segments.obs, segments.action).sum(-1)
        true = segments.oracle_reward.sum(-1)
        decided = true[first] != true[second]
        agree = jnp.sign(predicted[first] - predicted[second]) == jnp.sign(true[first] - true[second])
        return jnp.where(decided, agree, False).sum() / jnp.maximum(decided.sum(), 1), decided.sum()

    key = jax.random.PRNGKey(args.seed)
    agent_key, model_key, key = jax.random.split(key, 3)
    agent = agent_init(agent_key)
    ensemble = init_ensemble(model_key, model, spec)

    # Before RL: the untrained policy's steps standardise the model's inputs, and the overseer
    # answers the initial queries about them (an untrained ensemble's disagreements).
    _, segments, _ = play(agent, ensemble)
    ensemble = set_input_statistics(ensemble, model, spec, segments.obs.reshape(-1, *spec.observation_shape))
    labels = empty_labels(spec, capacity, SEGMENT, model.ensemble_size)
    for _ in range(initial_asks):
        key, ask_key = jax.random.split(key)
        labels = ask(labels, ensemble, segments, ask_key)
    for _ in range(4):
        key, fit_key = jax.random.split(key)
        ensemble, _ = fit_round(ensemble, model, spec, labels, fit_key, args.fit_steps)
    ensemble = normalize(ensemble, segments)

    results = {}
    for round_ in range(args.rounds):
        key, ask_key, fit_key, score_key = jax.random.split(key, 4)
        agent, segments, (episodes, return_sum) = play(agent, ensemble)
        accuracy, decided = score(ensemble, segments, score_key)  # on steps it has not been fit to
        labels = ask(labels, ensemble, segments, ask_key)
        ensemble, metrics = fit_round(ensemble, model, spec, labels, fit_key, args.fit_steps)
        ensemble = normalize(ensemble, segments)
        mean_return = float(return_sum / max(int(episodes), 1))
        results = {"accuracy": float(accuracy) if int(decided) else float("nan"), "return": mean_return,
                   "labels": int(labels.ring.size)}
        print(f"round {round_:3d}  labels {results['labels']:4d}  preference loss {float(metrics['loss'].mean()):.3f}  "
              f"r̂ ranks fresh pairs right {results['accuracy']:.2f} ({int(decided)} pairs)  "
              f"true return {mean_return:6.1f} ({int(episodes)} episodes)")
    return results


if __name__ == "__main__":
    main()
