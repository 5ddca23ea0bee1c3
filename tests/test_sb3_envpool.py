"""EnvPool as an SB3 ``VecEnv`` (benchmarks/sb3_envpool.py): the step that ends an episode returns
the next episode's first observation, the last one in its info, and tells a time limit from a fall."""
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")


def test_a_finished_copy_comes_back_reset_with_its_last_observation_and_why_it_ended():
    from benchmarks.sb3_envpool import EnvPoolVecEnv

    envs = EnvPoolVecEnv("CartPole-v1", 2, seed=0, max_episode_steps=5)
    envs.reset()
    for _ in range(4):
        envs.step(np.zeros(2, int))
    observations, _, dones, infos = envs.step(np.zeros(2, int))  # the fifth step: the time limit
    assert dones.tolist() == [True, True]
    assert all(info["TimeLimit.truncated"] for info in infos)
    last = np.stack([info["terminal_observation"] for info in infos])
    assert np.all(np.abs(last[:, 1]) > 0.5)  # pushed left five times: moving fast
    assert np.all(np.abs(observations) < 0.05)  # a fresh episode's start, not its last state
    observations, _, dones, _ = envs.step(np.zeros(2, int))  # no step lost to EnvPool's own reset
    assert not dones.any() and np.all(np.abs(observations[:, 1]) < 0.5)
    assert observations.dtype == np.float32 and envs.observation_space.dtype == np.float32

    falls = EnvPoolVecEnv("CartPole-v1", 1, seed=0)  # pushed left until the pole falls
    falls.reset()
    for _ in range(100):
        _, _, dones, infos = falls.step(np.zeros(1, int))
        if dones[0]:
            break
    assert dones[0] and infos[0]["TimeLimit.truncated"] is False


def test_frames_keep_their_dtype_for_sb3s_image_policies():
    from benchmarks.sb3_envpool import EnvPoolVecEnv

    envs = EnvPoolVecEnv("Pong-v5", 2, seed=0, reward_clip=False)
    assert envs.observation_space.dtype == np.uint8 and envs.reset().dtype == np.uint8
    observations, rewards, _, _ = envs.step(np.zeros(2, int))
    assert observations.shape == (2, 4, 84, 84) and observations.dtype == np.uint8 and rewards.dtype == np.float32
