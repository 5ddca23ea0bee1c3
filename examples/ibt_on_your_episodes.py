"""IBT on episodes of your own: fit a utility to progress and regress marks, then read the
agent's reward off its rise.

The episodes here are a toy stand-in for yours: a point takes a random walk on a line, and an
annotator marks a frame +1 when the point moved right by more than a threshold since the frame
before, -1 when it moved left by as much, and leaves most frames unmarked. The utility network
is fitted with Algorithm 1's loss over every pair of frames (``ibt_loss``) by a plain Optax loop
written here, and equation 2's reward (``utility_reward``) is compared with the true progress
on episodes it never saw.

    python examples/ibt_on_your_episodes.py --steps 300
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlhf_jax.reward import UtilityMLP, ibt_loss, utility_reward


def make_episodes(key: jax.Array, episodes: int, length: int, threshold: float = 0.5, marked: float = 0.3):
    """``(obs [B, T, 2], marks [B, T], progress [B, T-1])``: a random walk and its marks."""
    step_key, noise_key, mark_key = jax.random.split(key, 3)
    steps = jax.random.normal(step_key, (episodes, length))
    position = jnp.cumsum(steps, axis=1)
    # The second input is noise the utility has to learn to ignore.
    obs = jnp.stack([position, jax.random.normal(noise_key, position.shape)], axis=-1)
    progress = position[:, 1:] - position[:, :-1]
    events = jnp.where(progress > threshold, 1, jnp.where(progress < -threshold, -1, 0))
    shown = jax.random.bernoulli(mark_key, marked, events.shape)
    # A mark on frame t + 1 is about the move from t to t + 1; frame 0 carries none.
    marks = jnp.concatenate([jnp.zeros((episodes, 1), jnp.int32), jnp.where(shown, events, 0)], axis=1)
    return obs, marks, progress


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="Adam steps")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--length", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    key = jax.random.PRNGKey(args.seed)
    data_key, test_key, init_key = jax.random.split(key, 3)
    obs, marks, _ = make_episodes(data_key, args.episodes, args.length)
    valid = jnp.ones(marks.shape, bool)
    test_obs, _, test_progress = make_episodes(test_key, args.episodes, args.length)

    utility = UtilityMLP(observation_shape=(2,), hidden=(32, 32))
    params = utility.init(init_key, obs[0, 0])
    optimizer = optax.adam(1e-3)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(lambda p: ibt_loss(utility.apply(p, obs), marks, valid))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    for i in range(args.steps):
        params, opt_state, loss = step(params, opt_state)
        if i % max(1, args.steps // 5) == 0 or i == args.steps - 1:
            print(f"step {i:4d}  IBT loss {float(loss):.4f}")

    u = utility.apply(params, test_obs)                  # [B, T]
    reward = utility_reward(u[:, :-1], u[:, 1:])          # [B, T-1]: r_t = U(x_{t+1}) - U(x_t)
    correlation = float(np.corrcoef(np.ravel(reward), np.ravel(test_progress))[0, 1])
    print(f"correlation of the learned reward with the true progress on unseen episodes: {correlation:.3f}")
    return correlation


if __name__ == "__main__":
    main()
