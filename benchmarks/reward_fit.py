"""Fitting the reward model: labelled preference pairs per second, 3-member ensemble, 25-step segments.

    python -m benchmarks.reward_fit [--quick] [--only PART ...]

* ``mlp_pairs_per_s``: the MLP of appendix A.1 on CartPole-sized observations (4 floats,
  2 actions), ``fit`` as one compiled ``lax.scan`` of gradient steps;
* ``cnn_pairs_per_s``: the Atari CNN of appendix A.2 on 84x84x4 uint8 frames, as a Python
  loop over one compiled step (``cnn_loop_pairs_per_s``) and, off CPU, also as one
  ``lax.scan`` (``cnn_scan_pairs_per_s``). XLA:CPU runs convolution gradients many times
  slower inside loops (one scanned 64-pair step had not finished after 9 minutes on 2
  cores), so on CPU the scan is not measured. A 64-pair step pushes 3 x 64 x 2 x 25 =
  9,600 frames through the CNN and back: on CPU ``--quick`` uses 4-pair minibatches
  (``cnn_batch_size``) to stay under a minute.
* Members written out against members vmapped (``mlp_members_*``, ``cnn_members_*``): the
  library runs each member's network in turn (``ensemble.over_members``); "before" is the
  same program with the members vmapped (a grouped convolution on XLA:CPU, several times
  slower there), traced with ``over_members`` swapped for ``jax.vmap``. The two compiled
  fits alternate, after, before, after, before, over ``rounds`` rounds, compiling
  excluded; each side's pairs/s is the median over rounds with ``[min, max]``, the ratio
  (after over before) the median of the rounds' ratios, and the load average is recorded
  around every round (:func:`benchmarks.common.side_by_side`, the rule every peer shares).
  ``mlp_pairs_per_s`` and ``cnn_loop_pairs_per_s`` are the "after"
  medians.
* ``reward_cnn_fit_over_torch``: our CNN fit step (64 pairs, ``cnn_b64_pairs_per_s``) over a
  PyTorch twin of it (``torch_cnn_b64_pairs_per_s``, :func:`torch_cnn_twin`), alternating
  as above (target >= 1.0); ``..._b4`` the same at 4 pairs. Before the convolutions'
  gradients were reworked for XLA:CPU (:mod:`rlhf_jax.ops.conv`) it was 0.62.
* ``--only PART`` (mlp, members, torch, imitation) measures some parts, each short enough
  to time on a paused machine, and keeps the stored result's other figures.
* ``ensemble_fit_over_imitation``: our MLP figure over HumanCompatibleAI ``imitation``'s
  ``EnsembleTrainer`` (PyTorch, CPU) doing the same work, when ``imitation`` imports
  (target >= 10).

A "pair" is one labelled pair in one member's minibatch: a step of ``fit`` consumes
``batch_size`` (64) pairs in each of the 3 members at once, and ``imitation``'s
``EnsembleTrainer.train`` on N pairs trains each member on N (bootstrapped) pairs, so
both count N per N pairs seen by every member. Both sides use the same network (two
hidden layers of 64 leaky ReLUs over observation and one-hot action), minibatch of 64,
Adam at 3e-4, l2 penalty 1e-3, and the 10% random-answer likelihood.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import (Headline, Side, Target, enable_compilation_cache, parse_parts, side_by_side,
                               steps_per_second, write_result)
from rlhf_jax.envs.core import Discrete, EnvSpec
from rlhf_jax.ops.ring import full_ring
from rlhf_jax.reward import ensemble
from rlhf_jax.reward.data import Labels, empty_labels
from rlhf_jax.reward.networks import reward_network_for

SEGMENT = 25
CARTPOLE = EnvSpec(id="gymnax/CartPole-v1", backend="gymnax", num_envs=1, observation_shape=(4,),
                   observation_dtype="float32", action_space=Discrete(2), fps=50.0, max_episode_steps=500)
ATARI = EnvSpec(id="envpool/Pong-v5", backend="envpool", num_envs=1, observation_shape=(84, 84, 4),
                observation_dtype="uint8", action_space=Discrete(6), fps=15.0, max_episode_steps=27_000)
CONFIG = ensemble.RewardModelConfig()


def random_labels(spec: EnvSpec, capacity: int, seed: int = 0) -> Labels:
    """A full buffer of random pairs, labels and 1/e holdout columns (throughput only)."""
    rng = np.random.default_rng(seed)
    labels = empty_labels(spec, capacity, SEGMENT, CONFIG.ensemble_size)
    # Atari: random frames, each stored once; the fit step rebuilds the stacks from them.
    if spec.observation_dtype == "uint8":
        frames = rng.integers(0, 256, labels.frames.shape, dtype=np.uint8)
    else:
        frames = rng.normal(size=labels.frames.shape).astype(np.float32)
    return labels.replace(
        frames=jnp.asarray(frames),
        action=jnp.asarray(rng.integers(0, spec.action_space.n, labels.action.shape), jnp.int32),
        mu=jnp.asarray(rng.integers(0, 2, (capacity,)), jnp.float32),
        holdout=jnp.asarray(rng.random((capacity, CONFIG.ensemble_size)) < CONFIG.validation_fraction),
        ring=full_ring(capacity),
    )


def measure_fit(spec: EnvSpec, config: ensemble.RewardModelConfig, capacity: int, steps: int, repeats: int,
                loop: bool) -> float:
    """Pairs per second of ``fit``: ``steps`` steps as one scan, or as a Python loop of 1-step fits."""
    labels = random_labels(spec, capacity)
    state = jax.jit(ensemble.init_ensemble, static_argnums=(1, 2))(jax.random.key(0), config, spec)
    fit = jax.jit(ensemble.fit, static_argnums=(1, 2, 5), donate_argnums=0)
    chunk = 1 if loop else steps
    key = jax.random.key(1)
    state, _ = jax.block_until_ready(fit(state, config, spec, labels, key, chunk))  # compile

    def run():
        nonlocal state
        for _ in range(steps // chunk):
            state, metrics = fit(state, config, spec, labels, key, chunk)
        jax.block_until_ready(metrics)

    return steps_per_second(run, steps * config.batch_size, repeats)


def _vmapped_members(fn, *stacked):
    """The ensemble's members as they ran before: one network call vmapped over the member axis."""
    return jax.vmap(fn)(*stacked)


@contextlib.contextmanager
def _members(way: str):
    """Trace the ensemble with its members ``"written_out"`` (the library) or ``"vmapped"`` (before)."""
    library = ensemble.over_members
    ensemble.over_members = library if way == "written_out" else _vmapped_members
    try:
        yield
    finally:
        ensemble.over_members = library


def compiled_fit(spec: EnvSpec, config: ensemble.RewardModelConfig, labels: Labels, state, chunk: int, way: str):
    """``fit`` of ``chunk`` steps compiled ahead of time (state donated) with the members run ``way``."""
    def fit(state, labels, key):  # a new function per call: no trace is shared between the two ways
        return ensemble.fit(state, config, spec, labels, key, chunk)

    with _members(way):
        return jax.jit(fit, donate_argnums=0).lower(state, labels, jax.random.key(1)).compile()


def fit_side(spec: EnvSpec, config: ensemble.RewardModelConfig, capacity: int, steps: int, loop: bool,
             way: str = "written_out") -> tuple[Side, float]:
    """Our ``fit`` as one side of :func:`~benchmarks.common.side_by_side`: ``steps`` steps (one
    scan, or a Python loop of 1-step fits) with the members run ``way``; and its compile seconds."""
    labels = random_labels(spec, capacity)
    state = jax.jit(ensemble.init_ensemble, static_argnums=(1, 2))(jax.random.key(0), config, spec)
    chunk = 1 if loop else steps
    key = jax.random.key(1)
    start = time.perf_counter()
    fit = compiled_fit(spec, config, labels, state, chunk, way)
    compile_s = time.perf_counter() - start
    print(f"{spec.id}: members {way}, {config.batch_size}-pair steps: compiled in {compile_s:.1f} s", flush=True)

    def run():
        nonlocal state
        for _ in range(steps // chunk):
            state, metrics = fit(state, labels, key)
        jax.block_until_ready(metrics)

    return Side(run, steps * config.batch_size), compile_s


def alternate_members(spec: EnvSpec, config: ensemble.RewardModelConfig, capacity: int, steps: int, rounds: int,
                      loop: bool) -> dict:
    """Pairs per second of ``fit`` with the members written out ("after", the library) beside
    vmapped ("before"), alternating over ``rounds`` rounds of ``steps`` steps each."""
    after, after_compile = fit_side(spec, config, capacity, steps, loop, "written_out")
    before, before_compile = fit_side(spec, config, capacity, steps, loop, "vmapped")
    timed = side_by_side(after, before, rounds, label=f"{spec.id} members written out vs vmapped")
    return {"rounds": rounds, "steps_per_round": steps, "before_compile_s": before_compile,
            "after_compile_s": after_compile,
            **timed.fields("after_pairs_per_s", "before_pairs_per_s", "after_over_before")}


def _rounded(value):
    if isinstance(value, float):
        return round(value, 4) if abs(value) < 100 else round(value, 1)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def torch_cnn_twin(config: ensemble.RewardModelConfig, capacity: int) -> Side | str:
    """A PyTorch twin of our Atari reward-CNN fit step, or why there is none (torch missing).

    The same maths as :func:`rlhf_jax.reward.ensemble.fit` with :class:`rlhf_jax.reward.networks.RewardCNN`:
    per member, its own ``batch_size`` rows drawn with replacement, both 25-step segments of
    each pair through 4 convolutions (no bias) each with batch norm, leaky ReLU and dropout,
    then 64 leaky-ReLU units and one output; the returns' Bradley-Terry loss with the 10%
    random answer, plus l2 on the kernels; one Adam step. Frames are uint8 stacks stored whole
    in torch's channel-first layout (ours rebuilds each stack from frames stored once, which
    costs it a gather). Initialisation is torch's default: it does not change the time. It runs
    on a GPU where torch sees one, as ours runs on JAX's default device.
    """
    try:
        import torch
        from torch import nn
    except Exception as error:  # ImportError, or a broken install
        return f"torch not importable ({type(error).__name__}: {error})"

    torch.manual_seed(0)
    cnn = reward_network_for(ATARI, config)
    height, width, channels = ATARI.observation_shape

    def member() -> nn.Module:
        layers, size, depth = [], height, channels
        for features, kernel, stride in cnn.convs:
            layers += [nn.Conv2d(depth, features, kernel, stride, bias=False), nn.BatchNorm2d(features),
                       nn.LeakyReLU(cnn.slope), nn.Dropout(cnn.dropout)]
            size, depth = (size - kernel) // stride + 1, features
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(depth * size * size, cnn.hidden),
                             nn.LeakyReLU(cnn.slope), nn.Linear(cnn.hidden, 1))

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    members = [member().to(device) for _ in range(config.ensemble_size)]
    kernels = [[m.weight for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))] for net in members]
    optimizer = torch.optim.Adam([p for net in members for p in net.parameters()], lr=config.learning_rate)
    generator = torch.Generator().manual_seed(1)
    stacks = torch.randint(0, 256, (capacity, 2, SEGMENT, channels, height, width), dtype=torch.uint8,
                           generator=generator).to(device)
    mu = torch.randint(0, 2, (capacity,), generator=generator).float().to(device)
    eps = torch.tensor(config.random_answer_prob, device=device)
    log_right, log_random = torch.log1p(-eps), torch.log(eps / 2)

    def member_loss(net, kernels) -> torch.Tensor:
        rows = torch.randint(0, capacity, (config.batch_size,), generator=generator).to(device)
        frames = stacks[rows].reshape(-1, channels, height, width).float() / 255.0
        returns = net(frames).reshape(config.batch_size, 2, SEGMENT).sum(-1)
        difference = returns[:, 0] - returns[:, 1]
        log_p1 = torch.logaddexp(log_right + nn.functional.logsigmoid(difference), log_random)
        log_p2 = torch.logaddexp(log_right + nn.functional.logsigmoid(-difference), log_random)
        data = -(mu[rows] * log_p1 + (1.0 - mu[rows]) * log_p2).mean()
        return data + config.l2_init * sum(k.square().sum() for k in kernels)

    def step():
        optimizer.zero_grad(set_to_none=True)
        sum(member_loss(net, k) for net, k in zip(members, kernels)).backward()
        optimizer.step()
        if device.type == "cuda":  # CUDA kernels run asynchronously: the step ends when they have
            torch.cuda.synchronize()

    return Side(step, config.batch_size)


def against_torch(config: ensemble.RewardModelConfig, capacity: int, rounds: int) -> tuple[dict, str]:
    """Our CNN fit step beside its PyTorch twin, alternating; the result's keys and a note."""
    twin = torch_cnn_twin(config, capacity)
    if isinstance(twin, str):
        return {}, f"{twin}: no PyTorch twin of the CNN fit timed"
    import torch

    ours, _ = fit_side(ATARI, config, capacity, 1, loop=True)
    timed = side_by_side(ours, twin, rounds, label=f"CNN fit, {config.batch_size} pairs: ours vs torch")
    b = config.batch_size
    suffix = "" if b == CONFIG.batch_size else f"_b{b}"  # the target is at the paper's 64 pairs
    note = (f"torch {_version('torch')} on {torch.cuda.get_device_name()}" if torch.cuda.is_available()
            else f"torch {_version('torch')} on {torch.get_num_threads()} threads")
    return timed.fields(f"cnn_b{b}_pairs_per_s", f"torch_cnn_b{b}_pairs_per_s", f"reward_cnn_fit_over_torch{suffix}"), note


def measure_imitation(pairs: int, repeats: int) -> tuple[float | None, str]:
    """imitation's EnsembleTrainer on the MLP problem: pairs per second, or None and why not."""
    os.environ.setdefault("TQDM_DISABLE", "1")  # its training loop shows a progress bar
    try:
        import gymnasium as gym
        import torch as th
        from imitation.algorithms import preference_comparisons as pc
        from imitation.data import types
        from imitation.regularization import regularizers
        from imitation.rewards import reward_nets
        from imitation.util import logger as imit_logger
    except Exception as error:  # ImportError, or a version clash inside it
        return None, f"imitation not importable: {type(error).__name__}: {error}"

    th.manual_seed(0)
    obs_space = gym.spaces.Box(-np.inf, np.inf, CARTPOLE.observation_shape, np.float32)
    act_space = gym.spaces.Discrete(CARTPOLE.action_space.n)
    members = [
        reward_nets.BasicRewardNet(obs_space, act_space, hid_sizes=CONFIG.hidden, activation=th.nn.LeakyReLU)
        for _ in range(CONFIG.ensemble_size)
    ]
    model = pc.PreferenceModel(
        reward_nets.RewardEnsemble(obs_space, act_space, members), noise_prob=CONFIG.random_answer_prob
    )
    trainer = pc.EnsembleTrainer(
        model, pc.CrossEntropyRewardLoss(), rng=np.random.default_rng(0), batch_size=CONFIG.batch_size,
        epochs=1, lr=CONFIG.learning_rate,
        regularizer_factory=regularizers.LpRegularizer.create(initial_lambda=CONFIG.l2_init, p=2, val_split=None),
        custom_logger=imit_logger.configure(tempfile.mkdtemp(prefix="imitation-"), format_strs=[]),
    )

    rng = np.random.default_rng(0)

    def fragment():  # no rewards: the loss then computes only the model's preference
        return types.Trajectory(
            obs=rng.normal(size=(SEGMENT + 1, *CARTPOLE.observation_shape)).astype(np.float32),
            acts=rng.integers(0, act_space.n, SEGMENT), infos=None, terminal=False,
        )

    dataset = pc.PreferenceDataset()
    dataset.push([(fragment(), fragment()) for _ in range(pairs)], rng.integers(0, 2, pairs).astype(np.float32))
    trainer.train(dataset)  # warm-up
    return steps_per_second(lambda: trainer.train(dataset), pairs, repeats), f"imitation {_version('imitation')}"


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


PARTS = ("mlp", "members", "torch", "imitation")


def main() -> None:
    quick, parts, merge, repeats, rounds = parse_parts(__doc__.split("\n\n")[0], PARTS)
    enable_compilation_cache()
    cpu = jax.default_backend() == "cpu"
    cnn_config = dataclasses.replace(CONFIG, batch_size=4) if quick and cpu else CONFIG
    results: dict = {}
    start = time.perf_counter()

    if "mlp" in parts:
        mlp = alternate_members(CARTPOLE, CONFIG, 1_000, 100 if quick else 1_000, rounds, loop=False)
        results["mlp_pairs_per_s"] = round(mlp["after_pairs_per_s"], 1)
        results.update({f"mlp_members_{k}": _rounded(v) for k, v in mlp.items()})

    # 200 labels keep the buffer at 0.28 GB; the gather per step does not depend on it.
    if "members" in parts:
        cnn_steps = 1 if cpu else (10 if quick else 100)
        cnn = alternate_members(ATARI, cnn_config, 200, cnn_steps, rounds, loop=True)
        results["cnn_loop_pairs_per_s"] = round(cnn["after_pairs_per_s"], 1)
        if not cpu:
            results["cnn_scan_pairs_per_s"] = round(measure_fit(ATARI, cnn_config, 200, cnn_steps, repeats, False), 1)
        results["cnn_pairs_per_s"] = max(v for k, v in results.items() if k.startswith("cnn_"))
        results["cnn_batch_size"] = cnn_config.batch_size
        results.update({f"cnn_members_{k}": _rounded(v) for k, v in cnn.items()})

    if "torch" in parts:
        # The paper's 64 pairs (the target), and 4 pairs, where fixed costs weigh more.
        for batch in (4,) if quick else (64, 4):
            figures, results["torch"] = against_torch(dataclasses.replace(CONFIG, batch_size=batch), 200, rounds)
            results.update(figures)
            print(results["torch"], flush=True)

    if "imitation" in parts:
        imitation, results["imitation"] = measure_imitation(256 if quick else 2_048, repeats)
        if imitation is not None:
            results["imitation_mlp_pairs_per_s"] = round(imitation, 1)
            if "mlp_pairs_per_s" in results:
                results["ensemble_fit_over_imitation"] = round(results["mlp_pairs_per_s"] / imitation, 4)

    write_result("reward_fit", {
        "quick": quick, "ensemble_size": CONFIG.ensemble_size, "batch_size": CONFIG.batch_size,
        "segment_length": SEGMENT, "parts": list(parts), "seconds": round(time.perf_counter() - start, 1),
        **results,
    }, headline=headline, merge=merge)


def headline(result: dict) -> list[Headline]:
    """The report's rows: the MLP ensemble against imitation (the module docstring's target), and the CNN."""
    r = result
    return [
        # imitation's figures are missing where it does not import; "imitation" says why.
        Headline(f"Reward ensemble fit, pairs/s ({r['ensemble_size']} MLPs, {r['segment_length']}-step segments) "
                 f"vs imitation ({r.get('imitation', 'not measured')})",
                 r["mlp_pairs_per_s"], r.get("imitation_mlp_pairs_per_s"), r.get("ensemble_fit_over_imitation"),
                 Target.on(r, "ensemble_fit_over_imitation", ">=", 10.0)),
        Headline(f"Reward ensemble fit, pairs/s, Atari CNN (minibatch {r['cnn_batch_size']} pairs)",
                 r["cnn_pairs_per_s"]),
    ] + [
        Headline(f"Reward ensemble fit, pairs/s, Atari CNN vs its PyTorch twin ({r['torch']}; minibatch {b} pairs; "
                 f"median of {len(r[f'reward_cnn_fit_over_torch{suffix}_rounds'])} alternating rounds)",
                 r[f"cnn_b{b}_pairs_per_s"], r[f"torch_cnn_b{b}_pairs_per_s"], r[f"reward_cnn_fit_over_torch{suffix}"],
                 Target.on(r, "reward_cnn_fit_over_torch", ">=", 1.0) if not suffix else None)
        for b, suffix in ((64, ""), (4, "_b4")) if f"reward_cnn_fit_over_torch{suffix}" in r
    ] + ([
        # Not a peer: the same fit with the members vmapped, as the library ran it before.
        Headline(f"Reward ensemble fit, pairs/s, Atari CNN, {r['ensemble_size']} members written out vs vmapped "
                 f"(minibatch {r['cnn_batch_size']} pairs; median of {r['cnn_members_rounds']} alternating rounds)",
                 r["cnn_members_after_pairs_per_s"], r["cnn_members_before_pairs_per_s"],
                 r["cnn_members_after_over_before"]),
    ] if "cnn_members_after_over_before" in r else [])


if __name__ == "__main__":
    main()
