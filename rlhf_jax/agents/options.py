"""The agents' config sections (``a2c:``, ``acer:``, ``dqn:``, ``trpo:`` of an experiment), apart
from the agents themselves: this module imports no JAX, so that a config is read and checked
(``rlhf-jax train``'s mistakes reported) before JAX is imported. Each agent module imports its
section from here and exports it (``rlhf_jax.agents.a2c.A2CConfig``)."""
from __future__ import annotations

import dataclasses
from typing import Literal

from rlhf_jax.config_base import (INT32_MAX, MAX_LAYER, check_decay_horizon, check_fields, in_range, in_state,
                                  non_negative, positive)

__all__ = ["A2CConfig", "ACERConfig", "DQNConfig", "TRPOConfig"]


@dataclasses.dataclass(frozen=True)
class A2CConfig:
    """Defaults are the paper's (Christiano et al. appendix A.2; Mnih et al. 2016)."""

    total_env_steps: int = positive(10_000_000, INT32_MAX)
    num_steps: int = positive(5, 4096)  # n: steps per environment between updates
    gamma: float = in_range(0.99, 0, 1)
    entropy_coef: float = non_negative(0.01)
    value_coef: float = non_negative(0.5)
    learning_rate: float = in_state(positive(7e-4))
    # The rate decays linearly to zero at this many env steps (0: at total_env_steps).
    # Christiano et al. decay over 80M steps although their runs stop at 50M.
    lr_decay_env_steps: int = non_negative(0, INT32_MAX)
    rms_decay: float = in_range(0.99, 0, 1)
    rms_eps: float = non_negative(1e-5)
    max_grad_norm: float = positive(0.5)
    # Pixels: the 2013 CNN of the A3C paper ("a3c") or the Nature CNN ("nature").
    network: Literal["a3c", "nature"] = "a3c"
    mlp_hidden: tuple[int, ...] = positive((64, 64), MAX_LAYER)
    # The paper's actor and critic share a torso; separate torsos often suit continuous control better.
    shared_torso: bool = True
    # Clip rewards to [-reward_clip, reward_clip] (Atari on the true reward: 1.0); 0 = no clipping.
    reward_clip: float = non_negative(0.0)
    reward_scale: float = positive(1.0)
    log_std_init: float = 0.0  # Gaussian policies only

    def __post_init__(self):
        check_fields(self)
        check_decay_horizon("a2c", self.lr_decay_env_steps, self.total_env_steps)



@dataclasses.dataclass(frozen=True)
class ACERConfig:
    """Defaults are the paper's where it states them (Wang et al. 2016: k = 20, replay
    ratio 4, c = 10, delta = 1, alpha = 0.99, gamma = 0.99, entropy weight 0.001 on Atari
    as we read it); the optimiser, memory size, critic weight and gradient clipping it leaves
    open follow OpenAI Baselines' ACER. Counts of steps are env steps summed over environments.
    """

    total_env_steps: int = positive(10_000_000, INT32_MAX)
    num_steps: int = positive(20, 4096)  # k: the length of a trajectory
    gamma: float = in_range(0.99, 0, 1)
    replay_ratio: float = non_negative(4.0, 100)  # r: replayed updates per on-policy update, K ~ Poisson(r)
    replay_capacity: int = positive(50_000, 100_000_000)  # env steps the memory holds (whole trajectories of all envs)
    replay_start: int = non_negative(10_000, INT32_MAX)  # env steps stored before replay begins
    truncation: float = positive(10.0)  # c: importance weights truncated at c in the policy gradient
    trust_region: bool = True
    trust_region_delta: float = positive(1.0)  # delta
    average_decay: float = in_range(0.99, 0, 1)  # alpha of the average policy network
    entropy_coef: float = non_negative(0.001)
    value_coef: float = non_negative(0.5)  # weighs the critic's loss against the policy's
    learning_rate: float = positive(7e-4)
    # The rate decays linearly to zero at this many env steps (0: at total_env_steps).
    lr_decay_env_steps: int = non_negative(0, INT32_MAX)
    rms_decay: float = in_range(0.99, 0, 1)
    rms_eps: float = non_negative(1e-5)
    max_grad_norm: float = positive(10.0)
    # Pixels: the 2013 CNN of the A3C paper ("a3c") or the Nature CNN ("nature").
    network: Literal["a3c", "nature"] = "a3c"
    mlp_hidden: tuple[int, ...] = positive((64, 64), MAX_LAYER)
    reward_clip: float = non_negative(0.0)  # clip rewards to [-reward_clip, reward_clip]; 0 = no clipping
    reward_scale: float = positive(1.0)
    # Continuous actions only.
    sdn_samples: int = positive(5, 1000)  # n: actions u_i ~ pi in the stochastic dueling network
    log_std_init: float = 0.0

    def __post_init__(self):
        check_fields(self)
        check_decay_horizon("acer", self.lr_decay_env_steps, self.total_env_steps)



@dataclasses.dataclass(frozen=True)
class DQNConfig:
    """Defaults are the paper's (Mnih et al. 2015, Methods and Extended Data Table 1).

    Every count of steps is in env steps summed over all environments (module docstring).
    """

    total_env_steps: int = positive(50_000_000, INT32_MAX)  # "a total of 50 million frames"
    replay_capacity: int = positive(1_000_000, 100_000_000)  # replay memory size
    batch_size: int = positive(32, 65_536)  # minibatch size
    target_update_period: int = positive(10_000, INT32_MAX)  # C, counted in parameter updates
    gamma: float = in_range(0.99, 0, 1)  # discount factor
    # RMSProp as DeepMind ran it (centred, the constant inside the square root), on the
    # gradient G of the loss *summed* over the minibatch (Torch accumulates per-sample
    # gradients; our loss is the mean, so G = batch_size * its gradient):
    #   g <- rho g + (1 - rho) G;  n <- rho n + (1 - rho) G^2;
    #   theta <- theta - lr G / sqrt(n - g^2 + eps),
    # i.e. optax.rmsprop(lr, decay=rho, eps=eps, centered=True) after scaling by
    # batch_size. rho is both the table's "gradient momentum" and "squared gradient
    # momentum" (0.95 each); eps is its "min squared gradient".
    learning_rate: float = in_state(positive(0.00025))
    rms_decay: float = in_range(0.95, 0, 1)
    rms_eps: float = non_negative(0.01)
    epsilon_start: float = in_range(1.0, 0, 1)  # initial exploration
    epsilon_end: float = in_range(0.1, 0, 1)  # final exploration
    exploration_steps: int = positive(1_000_000, INT32_MAX)  # final exploration frame
    # Replay start size: acting only (epsilon still ~1) before learning.
    replay_start: int = non_negative(50_000, INT32_MAX)
    update_period: int = positive(4, 10_000)  # update frequency: env steps (actions) between parameter updates
    # Mnih 2015 on Atari: a lost life ends the agent's episode when it learns from the true
    # reward (``rlhf-jax train`` sets env.episodic_life for it). Learned rewards never do.
    life_loss_ends_episode: bool = True
    reward_clip: float = non_negative(1.0)  # rewards clipped to [-1, 1]; 0 = no clipping
    huber_delta: float = positive(1.0)  # error clipping: the TD error's gradient clipped to [-delta, delta]
    eval_epsilon: float = in_range(0.05, 0, 1)  # evaluation policy
    double_q: bool = False  # van Hasselt et al. 2016 target
    mlp_hidden: tuple[int, ...] = positive((64, 64), MAX_LAYER)  # vector observations (pixels take the Nature CNN)

    def __post_init__(self):
        check_fields(self)



@dataclasses.dataclass(frozen=True)
class TRPOConfig:
    """Defaults follow Christiano et al. appendix A.1 (gamma, lambda) and common TRPO practice (module docstring)."""

    total_env_steps: int = positive(5_000_000, INT32_MAX)
    # Env steps per iteration, summed over environments; each environment takes
    # ceil(batch_size / num_envs) steps. Copies that start together and run episodes of one
    # fixed length stay in step, so let each take a whole number of episodes: otherwise a
    # batch holds only part of the episode and the KL bound ignores the rest
    # (configs/trpo_pendulum.yaml shows what that does).
    batch_size: int = positive(5_000, 10_000_000)
    gamma: float = in_range(0.995, 0, 1)
    gae_lambda: float = in_range(0.97, 0, 1)
    max_kl: float = positive(0.01)  # delta: the bound on the mean KL(pi_old || pi_new)
    # The KL that max_kl bounds and whose Hessian (plus cg_damping) is the Fisher: the whole
    # action's (Schulman et al.'s, Baselines'), or its mean over the action's dimensions
    # (sb3-contrib's), a trust region dims times wider for the same numbers. Gaussian policies only.
    kl_per_action_dimension: bool = False
    cg_iterations: int = positive(10, 1000)
    cg_damping: float = non_negative(0.1)
    # The Fisher-vector products from every k-th time step of every copy (1: from the whole
    # batch), as OpenAI Baselines' TRPO takes them (every 5th); Schulman et al. 2015 (appendix C)
    # took 10% of the data. The ten products were most of an update's arithmetic; the gradient,
    # and the line search's KL and surrogate, still use the whole batch.
    fisher_subsample: int = positive(5, 1000)
    line_search_steps: int = positive(10, 1000)
    line_search_decay: float = in_range(0.5, 0, 1, low_open=True, high_open=True)
    # beta: 0 on the true reward; 0.01 (Swimmer: 0.001) when learning from the reward predictor.
    entropy_coef: float = non_negative(0.0)
    # The bonus on the whole action's entropy, or on its mean over the action's dimensions (beta
    # over the dimensions on the sum), as kl_per_action_dimension takes the KL: with that wider
    # trust region the whole action's bonus widens multi-joint policies past the action box
    # (experiments/log/figure2.md). Gaussian policies only.
    entropy_per_action_dimension: bool = False
    normalize_advantages: bool = True
    # The value function: its own network fitted with Adam to the lambda-returns.
    value_learning_rate: float = in_state(positive(1e-3))
    value_epochs: int = positive(5, 1000)
    value_minibatches: int = positive(8, 65_536)
    # Fit V to standardised returns, V(s) = mean + std f(s), with the mean and std of the last
    # batch's returns (as rllab's value regressor does, normalize_outputs). Adam's step does not
    # grow with the targets, so without it V lags returns far from 0: r-hat normalised to std 1
    # gives returns up to 1 / (1 - gamma) = 200 (experiments/log/figure2.md, "The reward's scale").
    normalize_value_targets: bool = False
    policy_hidden: tuple[int, ...] = positive((64, 64), MAX_LAYER)
    value_hidden: tuple[int, ...] = positive((64, 64), MAX_LAYER)
    activation: Literal["tanh", "relu"] = "tanh"
    network: Literal["a3c", "nature"] = "a3c"  # the torso for stacked Atari frames, if ever used
    log_std_init: float = 0.0  # Gaussian policies only
    # Policy and value read each observation standardised by the running mean and std of every
    # observation seen so far, clipped to [-5, 5] (:func:`rlhf_jax.ops.standardize`), as OpenAI
    # Baselines' TRPO and Schulman's modular_rl feed theirs; the moments take in each batch before
    # its update, as Baselines' do. Not in the paper, which names TRPO and no input scaling.
    normalize_observations: bool = False
    # The standardisation's clip and its floor on each coordinate's std. Baselines' (5, 0.1) by
    # default; Stable-Baselines3's VecNormalize, which sb3-contrib's TRPO reads through, clips
    # at 10 with a floor of 1e-4 (sqrt of its epsilon 1e-8).
    observation_clip: float = positive(5.0)
    observation_min_std: float = positive(0.1)
    # When a batch joins the moments. "before_update", as Baselines: the update reads the batch
    # standardised otherwise than the policy that acted on it read it, so its old policy is not
    # the one that drew the actions, by more the narrower the policy. "after_update": the update
    # reads the batch as it was acted on. "every_step": the moments take in each step's
    # observations before the policy acts on them, and the update reads the batch as it was
    # acted on, as sb3-contrib's TRPO (through VecNormalize) does.
    observation_moments: Literal["before_update", "after_update", "every_step"] = "before_update"
    reward_scale: float = positive(1.0)

    def __post_init__(self):
        check_fields(self)

