"""The device replay memory: frames stored once and rebuilt into EnvPool's stacks, ring wrap-around,
episode boundaries, which transitions may be sampled, final observations, and the vector-observation path."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import replay
from rlhf_jax.envs import Discrete, EnvConfig, make
from rlhf_jax.envs.core import TimeStep


def step_result(reward, terminated, truncated, action_ignored, final_obs=None):
    """The TimeStep ``add`` reads. It never reads ``timestep.obs`` (o_{t+1} is the next add's o_t),
    nor ``final_obs`` unless the memory keeps it."""
    return TimeStep(None, reward, terminated, truncated, final_obs, action_ignored, {})


@jax.jit
def fill(memory, steps):
    """Add ``steps`` (a dict of arrays with leading axis T) one vector step at a time, in one scan."""

    def body(memory, s):
        timestep = step_result(s["reward"], s["terminated"], s["truncated"], s["action_ignored"], s.get("final_obs"))
        return replay.add(memory, s["obs"], s["action"], timestep), None

    return jax.lax.scan(body, memory, steps)[0]


def reference_mask(first, valid, stack, rows):
    """NumPy: which steps t of each environment ``sample`` may return, after all T steps were added to
    ``rows`` rows. Step t is in memory if t >= T - rows; it needs step t + 1 and every frame of its stack
    (steps max(t - stack + 1, start of its episode) .. t) in memory, and must be a real transition."""
    T, N = first.shape
    oldest = max(0, T - rows)
    mask = np.zeros((T, N), bool)
    for e in range(N):
        start = 0
        for t in range(T):
            if first[t, e]:
                start = t
            needs = max(t - stack + 1, start)
            mask[t, e] = oldest <= needs and t + 1 < T and valid[t, e]
    return mask


def check_all_transitions(memory, steps, stack):
    """Every transition the memory may sample equals the recorded one; the sampleable set equals the reference."""
    T, N = steps["action"].shape
    rows = memory.rows
    expected = reference_mask(steps["first"], ~steps["action_ignored"], stack, rows)
    mask = np.asarray(replay.valid_mask(memory))
    stored = np.arange(max(0, T - rows), T)
    np.testing.assert_array_equal(mask[stored % rows], expected[stored])
    assert mask.sum() == expected.sum()  # rows never written are not sampleable either
    t, e = np.nonzero(expected)
    batch = jax.tree.map(np.asarray, replay.gather(memory, jnp.asarray(t % rows), jnp.asarray(e)))
    assert batch.mask.all()
    np.testing.assert_array_equal(batch.obs, steps["obs"][t, e])
    np.testing.assert_array_equal(batch.next_obs, steps["obs"][t + 1, e])
    # EnvPool resets on the step after an end: the observation a step reached is the next one stored.
    np.testing.assert_array_equal(batch.final_obs, steps["obs"][t + 1, e])
    np.testing.assert_array_equal(batch.action, steps["action"][t, e])
    np.testing.assert_array_equal(batch.reward, steps["reward"][t, e])
    np.testing.assert_array_equal(batch.terminated, steps["terminated"][t, e])
    np.testing.assert_array_equal(batch.truncated, steps["truncated"][t, e])
    assert not batch.action_ignored.any()
    # The rebuilt TimeStep, for a reward function on replay.
    timestep = batch.timestep
    assert timestep.info == {}
    for name in ("obs", "final_obs"):
        np.testing.assert_array_equal(getattr(timestep, name), steps["obs"][t + 1, e])
    for name in ("reward", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(timestep, name), steps[name][t, e])
    return expected


# ---------------------------------------------------------------- synthetic frame stacks


def envpool_like_rollout(T=60, N=3, stack=4, seed=0):
    """Stacks built by EnvPool's rule from frames numbered uniquely (frame = its step number * N + env):
    a reset fills the stack with the first frame; a step drops the oldest frame and appends the new one.
    Episodes end at random, by termination or time limit; the step after an end is the reset step
    (action ignored, not a transition)."""
    rng = np.random.default_rng(seed)
    obs = np.zeros((T + 1, N, 1, 1, stack), np.int32)
    first = np.zeros((T + 1, N), bool)
    done = rng.random((T, N)) < 0.12
    truncated = done & (rng.random((T, N)) < 0.5)
    for e in range(N):
        for t in range(T + 1):
            frame = t * N + e + 1
            first[t, e] = t == 0 or done[t - 1, e]
            obs[t, e] = frame if first[t, e] else np.append(obs[t - 1, e, ..., 1:], frame)
    return {"obs": obs, "first": first[:-1], "action_ignored": first[1:], "terminated": done & ~truncated,
            "truncated": truncated, "action": rng.integers(0, 6, (T, N)).astype(np.int32),
            "reward": rng.normal(size=(T, N)).astype(np.float32)}


@pytest.mark.slow
@pytest.mark.parametrize("rows", [100, 23])  # no wrap; wrapped more than twice
def test_rebuilt_stacks_follow_envpool_rule(rows):
    steps = envpool_like_rollout()
    N = steps["action"].shape[1]
    memory = fill(replay.init(rows * N, N, (1, 1, 4), jnp.int32, stack=4), {k: v[:60] for k, v in steps.items()})
    expected = check_all_transitions(memory, steps, stack=4)
    assert expected.sum() > 20


@pytest.mark.slow
def test_no_frame_crosses_an_episode_boundary():
    steps = envpool_like_rollout(T=80, seed=1)
    N = steps["action"].shape[1]
    memory = fill(replay.init(30 * N, N, (1, 1, 4), jnp.int32, stack=4), {k: v[:80] for k, v in steps.items()})
    # Episode number of every frame id; every stack must hold frames of one episode only.
    episode = np.cumsum(np.concatenate([steps["first"], steps["action_ignored"][-1:]]), axis=0)
    episode_of_frame = {t * N + e + 1: episode[t, e] for t in range(81) for e in range(N)}
    rows, envs = np.nonzero(np.asarray(replay.valid_mask(memory)))
    batch = replay.gather(memory, jnp.asarray(rows), jnp.asarray(envs))
    for stacks in (batch.obs, batch.next_obs):
        for frames in np.asarray(stacks).reshape(len(rows), 4):
            assert len({episode_of_frame[f] for f in frames}) == 1


# ---------------------------------------------------------------- real EnvPool rollouts


def envpool_rollout(game, num_envs, T, max_episode_steps=0, seed=0):
    env = make(EnvConfig(id=f"envpool/{game}", num_envs=num_envs, max_episode_steps=max_episode_steps, seed=seed))
    actions = jax.random.randint(jax.random.PRNGKey(seed), (T, num_envs), 0, env.action_space.n)

    def run(actions):
        state, first = env.reset(jax.random.PRNGKey(0))

        def body(state, action):
            state, timestep = env.step(state, action)
            return state, (timestep.obs, timestep.reward, timestep.terminated, timestep.truncated,
                           timestep.action_ignored, timestep.info["true_done"])

        _, out = jax.lax.scan(body, state, actions)
        return first.obs, out

    first_obs, (obs, reward, terminated, truncated, ignored, true_done) = jax.tree.map(np.asarray,
                                                                                       jax.jit(run)(actions))
    # EnvPool resets on the step after a game ends: that step returns the new game's first observation,
    # ignoring the action. (Derived here from ``true_done``, and checked against action_ignored.)
    reset = np.concatenate([np.zeros((1, num_envs), bool), true_done[:-1]])
    np.testing.assert_array_equal(ignored, reset)
    obs = np.concatenate([first_obs[None], obs])
    first = np.concatenate([np.ones((1, num_envs), bool), reset])
    # The premise of storing frames once: EnvPool's stacks shift by one frame, and start as 4 copies.
    assert np.all(obs[1:][~reset][..., :3] == obs[:-1][~reset][..., 1:])
    assert np.all(obs[first] == obs[first][..., :1])
    return {"obs": obs, "first": first[:-1], "action_ignored": reset, "terminated": terminated,
            "truncated": truncated, "action": np.asarray(actions, np.int32), "reward": reward}


@pytest.mark.slow
@pytest.mark.parametrize("game, max_episode_steps, T", [("Pong-v5", 37, 150), ("Breakout-v5", 0, 400)])
def test_envpool_stacks_rebuilt_exactly(game, max_episode_steps, T):
    N = 3
    steps = envpool_rollout(game, N, T, max_episode_steps)
    assert steps["action_ignored"].sum() >= 3  # the rollout crosses episode ends
    for rows in (T + 5, T // 3):  # without, then with wrap-around
        memory = fill(replay.init(rows * N, N, (84, 84, 4), jnp.uint8, stack=4),
                      {k: v[:T] for k, v in steps.items() if k != "first"})
        expected = check_all_transitions(memory, steps, stack=4)
        # Random minibatches hold only sampleable transitions, and they equal EnvPool's observations.
        rows_, envs, ok = jax.jit(replay.sample_indices, static_argnums=2)(memory, jax.random.PRNGKey(rows), 256)
        rows_, envs = np.asarray(rows_), np.asarray(envs)
        assert np.asarray(ok).all()
        oldest_row = (int(memory.ring.next) - int(memory.ring.size)) % memory.rows
        t = T - int(memory.ring.size) + (rows_ - oldest_row) % memory.rows  # the step each row holds
        assert expected[t, envs].all()
        batch = replay.sample(memory, jax.random.PRNGKey(rows), 256)
        assert batch.obs.shape == (256, 84, 84, 4) and batch.obs.dtype == jnp.uint8


# ---------------------------------------------------------------- sampling


@pytest.mark.slow
def test_only_valid_indices_are_sampled():
    N = 2
    memory = replay.init(8 * N, N, (3,), jnp.float32)
    ones, no = jnp.ones((N,), bool), jnp.zeros((N,), bool)

    def add(memory, i, valid=ones):
        return replay.add(memory, jnp.full((N, 3), float(i)), jnp.zeros((N,), jnp.int32),
                          step_result(jnp.zeros((N,)), no, no, ~valid))

    # Empty, or a single step without its next observation: nothing to sample.
    assert not replay.sample(memory, jax.random.PRNGKey(0), 16).mask.any()
    memory = add(memory, 0)
    assert not replay.sample(memory, jax.random.PRNGKey(0), 16).mask.any()
    memory = add(memory, 1)
    batch = replay.sample(memory, jax.random.PRNGKey(0), 16)
    assert batch.mask.all() and np.all(batch.obs == 0.0) and np.all(batch.next_obs == 1.0)
    # 20 steps into 8 rows, env 1's step 15 invalid (a reset step): every draw is sampleable, and all are drawn.
    for i in range(2, 20):
        memory = add(memory, i, valid=jnp.array([True, i != 15]))
    mask = np.asarray(replay.valid_mask(memory))
    assert mask.sum() == 2 * 7 - 1  # 8 rows but the newest, and the reset step
    rows, envs, ok = replay.sample_indices(memory, jax.random.PRNGKey(1), 4000)
    counts = np.zeros_like(mask, int)
    np.add.at(counts, (np.asarray(rows), np.asarray(envs)), 1)
    assert np.asarray(ok).all() and np.all(counts[~mask] == 0)
    assert counts[mask].min() > 4000 / 13 * 0.6  # roughly uniform over the 13


@pytest.mark.slow
def test_inside_jit_scan_and_vmap():
    """add and sample under vmap (two memories, e.g. two seeds) inside a scan agree with one memory at a time."""
    N = 2

    def run(key):
        memory = replay.init(10 * N, N, (1, 1, 4), jnp.uint8, stack=4)

        def body(memory, key):
            obs = jax.random.randint(key, (N, 1, 1, 4), 0, 255).astype(jnp.uint8)
            no = jnp.zeros((N,), bool)
            memory = replay.add(memory, obs, jnp.zeros((N,), jnp.int32), step_result(jnp.ones((N,)), no, no, no))
            return memory, replay.sample(memory, key, 4).obs

        return jax.lax.scan(body, memory, jax.random.split(key, 25))[1]

    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    together = jax.jit(jax.vmap(run))(keys)
    for i in range(2):
        np.testing.assert_array_equal(together[i], jax.jit(run)(keys[i]))


# ---------------------------------------------------------------- vector observations


@pytest.mark.slow
def test_vector_observations_against_numpy():
    """gymnax restarts a copy within the step: o_{t+1} is the new episode's first observation, and
    the memory keeps the observation the step reached beside it. Episodes end by failure and by a
    time limit of 30 steps."""
    N, T, rows = 4, 150, 40
    env = make(EnvConfig(id="gymnax/CartPole-v1", num_envs=N, max_episode_steps=30))
    assert replay.keeps_final_obs(env.spec)
    actions = jax.random.randint(jax.random.PRNGKey(3), (T, N), 0, 2)

    def run(actions):
        state, first = env.reset(jax.random.PRNGKey(0))

        def body(carry, action):
            state, obs = carry
            state, ts = env.step(state, action)
            memory_input = {"obs": obs, "action": action, "reward": ts.reward, "terminated": ts.terminated,
                            "truncated": ts.truncated, "action_ignored": ts.action_ignored,
                            "final_obs": ts.final_obs}
            return (state, ts.obs), (memory_input, ts.obs)

        return jax.lax.scan(body, (state, first.obs), actions)[1]

    steps, next_obs = run(actions)
    memory = fill(replay.init(rows * N, N, (4,), jnp.float32, keep_final_obs=True), steps)
    steps, next_obs = jax.tree.map(np.asarray, (steps, next_obs))
    assert steps["terminated"].sum() >= 10 and steps["truncated"].sum() >= 2
    mask = np.asarray(replay.valid_mask(memory))
    # Stored: the last `rows` steps; sampleable: all of them but the newest.
    t = np.arange(T - rows, T - 1)
    assert mask.sum() == len(t) * N and mask[t % rows].all()
    tt, ee = np.repeat(t, N), np.tile(np.arange(N), len(t))
    batch = jax.tree.map(np.asarray, replay.gather(memory, jnp.asarray(tt % rows), jnp.asarray(ee)))
    np.testing.assert_array_equal(batch.obs, steps["obs"][tt, ee])
    # After an end the next observation is the new episode's first (the target must not bootstrap there),
    # and the final one is what the step reached (a time-limit end bootstraps there).
    np.testing.assert_array_equal(batch.next_obs, next_obs[tt, ee])
    np.testing.assert_array_equal(batch.final_obs, steps["final_obs"][tt, ee])
    ended = steps["terminated"][tt, ee] | steps["truncated"][tt, ee]
    assert ended.sum() >= 2 and (batch.final_obs[ended] != batch.next_obs[ended]).any(-1).all()
    np.testing.assert_array_equal(batch.final_obs[~ended], batch.next_obs[~ended])
    np.testing.assert_array_equal(batch.terminated, steps["terminated"][tt, ee])
    np.testing.assert_array_equal(batch.truncated, steps["truncated"][tt, ee])
    np.testing.assert_array_equal(batch.action, steps["action"][tt, ee])
    np.testing.assert_array_equal(batch.reward, steps["reward"][tt, ee])


# ---------------------------------------------------------------- memory


def test_nbytes_without_allocating():
    small = replay.init(64, 4, (84, 84, 4), jnp.uint8, stack=4)
    assert replay.nbytes(64, 4, (84, 84, 4), jnp.uint8, stack=4) == sum(x.nbytes for x in jax.tree.leaves(small))
    atari = replay.nbytes(1_000_000, 16, (84, 84, 4), jnp.uint8, stack=4)
    assert 1_000_000 * 84 * 84 < atari <= 8e9  # one frame per transition, plus a few bytes of bookkeeping
    assert replay.nbytes(1_000_000, 16, (84, 84, 4), jnp.uint8) > 3.9 * atari  # stacks stored whole
    # Where a step can restart a copy itself, one more whole observation per transition.
    minatar = replay.nbytes(1_000_000, 16, (10, 10, 4), jnp.float32)
    assert replay.nbytes(1_000_000, 16, (10, 10, 4), jnp.float32, keep_final_obs=True) == minatar + 1_000_000 * 1_600


def test_frame_stack_for_spec():
    atari = make(EnvConfig(id="envpool/Pong-v5", num_envs=1)).spec
    assert replay.frame_stack(atari) == 4 and isinstance(atari.action_space, Discrete)
    assert replay.frame_stack(make(EnvConfig(id="gymnax/Breakout-MinAtar", num_envs=1)).spec) == 1
    # EnvPool's next stored observation is a step's final one; gymnax's may be a new episode's first.
    assert not replay.keeps_final_obs(atari)
    assert replay.keeps_final_obs(make(EnvConfig(id="gymnax/Breakout-MinAtar", num_envs=1)).spec)
