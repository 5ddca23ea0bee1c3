"""The score masks cover what changes when the score does, and nothing else is touched."""
import jax
import numpy as np
import pytest

envpool = pytest.importorskip("envpool")

from rlhf_jax.envs.atari_masks import HIDDEN_REGIONS, hide_score

NUM_ENVS, STEPS = 4, 300
ENDURO_FIRE = 1  # Enduro's minimal action set: NOOP, FIRE (accelerate), RIGHT, LEFT, ...


def rollout(game):
    """(STEPS + 1, NUM_ENVS, 84, 84, 4) channel-last frames, rewards and dones of a fixed rollout."""
    env = envpool.make(f"{game}-v5", env_type="gymnasium", num_envs=NUM_ENVS, seed=0)
    rng = np.random.default_rng(0)
    obs, _ = env.reset()
    frames, rewards, dones = [obs], [np.zeros(NUM_ENVS)], [np.zeros(NUM_ENVS, bool)]
    for _ in range(STEPS):
        # Random play scores in every game but Enduro, where reward needs passing cars.
        if game == "Enduro":
            action = np.full(NUM_ENVS, ENDURO_FIRE)
        else:
            action = rng.integers(0, env.action_space.n, NUM_ENVS)
        obs, reward, term, trunc, _ = env.step(action)
        frames.append(obs)
        rewards.append(reward)
        dones.append(term | trunc)
    env.close()
    return np.stack(frames).transpose(0, 1, 3, 4, 2), np.stack(rewards), np.stack(dones)


def region_mask(regions):
    mask = np.zeros((84, 84), bool)
    for r in regions:
        mask[r.row_start : r.row_stop, r.col_start : r.col_stop] = True
    return mask


def test_table():
    assert set(HIDDEN_REGIONS) == {
        "BeamRider", "Breakout", "Enduro", "Pong", "Qbert", "Seaquest", "SpaceInvaders"
    }
    for regions in HIDDEN_REGIONS.values():
        for r in regions:
            assert 0 <= r.row_start < r.row_stop <= 84 and 0 <= r.col_start < r.col_stop <= 84
        assert region_mask(regions).mean() < 0.1  # the play area stays visible


@pytest.mark.parametrize("game", sorted(HIDDEN_REGIONS))
def test_hide_score(game):
    frames, rewards, dones = rollout(game)
    regions = HIDDEN_REGIONS[game]
    last = frames[..., -1]  # newest frame of each stack

    # (a) The score regions change across a reward: the score really is inside them.
    score = region_mask([r for r in regions if r.what.startswith("score")])
    events = [
        (t, e)
        for t, e in zip(*np.nonzero(rewards))
        if 1 <= t < STEPS and not dones[t - 1 : t + 2, e].any()
    ]
    # Rewards while something is drawn there (Q*bert's score is sometimes not shown).
    shown = [(t, e) for t, e in events if np.ptp(last[t - 1 : t + 2 : 2, e][:, score]) > 0]
    assert shown, f"no reward with the score on screen in {STEPS} steps"
    changed = [(last[t + 1, e][score] != last[t - 1, e][score]).any() for t, e in shown]
    assert np.mean(changed) >= 0.9
    # ... and mostly stay still otherwise (a region over the play area would not).
    quiet = (rewards[1:] == 0) & (rewards[:-1] == 0) & ~dones[1:] & ~dones[:-1]
    moved = (last[1:][..., score] != last[:-1][..., score]).any(-1)
    assert moved[quiet].mean() < 0.2
    # The other displays (BeamRider's enemies left, Enduro's speedometer) change over an
    # episode: compare first and last frames of copies that did not reset.
    whole_episode = ~dones.any(0)
    for r in regions:
        if not r.what.startswith("score"):
            window = last[:, :, r.row_start : r.row_stop, r.col_start : r.col_stop]
            assert (window[0] != window[-1])[whole_episode].any(), r.what

    hidden = np.asarray(jax.jit(hide_score, static_argnums=1)(frames, game))
    assert hidden.shape == frames.shape and hidden.dtype == np.uint8
    mask = region_mask(regions)
    # (b) Inside the regions every stacked frame of every step is black.
    assert (hidden[:, :, mask] == 0).all()
    # (c) Outside them nothing changes.
    assert np.array_equal(hidden[:, :, ~mask], frames[:, :, ~mask])
