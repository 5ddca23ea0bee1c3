"""Our TRPO against a reference TRPO (sb3-contrib's), side by side on this machine.

    python -m experiments.trpo_reference [--side ours|reference] [--tasks hopper,walker2d,halfcheetah,ant]
                                        [--seeds 3] [--first-seed 0] [--steps 1000000] [--no-control-cost]
                                        [--ours-as-reference] [--ours-overrides KEY=VALUE ...]
                                        [--reference-overrides KEY=VALUE ...] [--reference-on envpool]
    python -m experiments.trpo_reference --report

Figure 2's "RL" line is only a yardstick if it is as strong as the usual TRPO. This study
runs both on the standard Gymnasium v5 tasks (control cost kept, each task's own episode ends),
for the same env steps and seeds (``--seeds`` of them from ``--first-seed``: 0-2 for the
probes, a fresh block such as 100-102 to confirm what the probes found), or, with
``--no-control-cost``, on the tasks as figure 2 scores them (appendix A.1 removes the torque
cost; each side's records say which, and the report keeps the two apart):

* **ours**: the figure's RL agent, ``configs/paper/mujoco/<task>_trpo.yaml`` on EnvPool's C
  MuJoCo with ``env.control_cost=true`` and ``--ours-overrides`` (none by default), each task's
  seeds one ``rlhf-jax sweep`` (resumable chunk by chunk);
* **reference**: sb3-contrib's ``TRPO`` with the RL Zoo's settings for the task
  (``rl_zoo3/hyperparams/trpo.yml``, the task's ``-v4`` entry, or the zoo's MuJoCo defaults for the
  three tasks it has none for: observations and rewards normalised by
  ``VecNormalize``, 2 copies of 1,024 steps, gamma 0.99, lambda 0.95, 25 CG steps, 20 critic
  epochs), on Gymnasium's ``<Task>-v5``, torch on one thread, or with ``--reference-overrides``
  in place of the zoo's (``gamma=0.995 gae_lambda=0.97``: the paper's, as the figure's agent
  has them), recorded as another variant of the reference; with ``--reference-on envpool``, on
  EnvPool's ``<Task>-v5``, the task ours plays (:mod:`benchmarks.sb3_envpool`), its own variant
  too. Needs the ``peers`` extra and ``sb3-contrib`` and ``rl_zoo3``.

**The two bound different KLs.** sb3-contrib's TRPO (2.9.2) takes the mean of
``kl_divergence(new, old)`` over a ``[batch, action dims]`` array: for a diagonal Gaussian its
``target_kl`` bounds the KL *per action dimension*, where ours (``trpo.max_kl``), Schulman et
al.'s and Baselines' bound the KL of the whole action. Its 0.01 is therefore 0.03 on Hopper,
0.06 on Walker2d and 0.08 on Ant, and the zoo's 0.04 on HalfCheetah is 0.24, in our units.
Its Fisher-vector product is likewise the Hessian of that averaged KL, ``F / dims``, with its
damping of 0.1 added to it: a damping of ``0.1 x dims`` on ours. And its line search shrinks the
step by 0.8 per try where ours halves it. ``--ours-as-reference`` runs ours with all of the
reference's settings translated into our units (:func:`in_our_units`);
``--side reference --trace`` prints the reference's policy std, KL, whether its line search
took a step, and V's explained variance after each update (the first seed, nothing recorded), to
set beside the ``entropy``, ``kl`` and ``step_fraction`` columns of ours in its ``members.csv``.

Both are scored alike: the true return of the training episodes (the policy's own samples),
averaged per stretch of ``steps / 25`` env steps, and the run's final return is the mean of
the last tenth of those stretches (:func:`experiments.records.final_return`). The ratio per
task is ours over the reference, by the seeds' means; the target is 0.9 on every task. Beside
the return, each record holds the Gaussian policy's width per stretch (``policy_width``,
:func:`gaussian_width`: ours from its chunks' entropy, the reference's from its ``log_std`` as
each batch began), so that how fast each side's policy narrows can be read seed by seed.

Each (side, task) writes its records to ``results/trpo_reference_<side>_runs.json`` as it
finishes (the two sides can run at once; so can several processes of the reference given the same
block, each taking the seeds no other has claimed, :func:`experiments.records.claimed`); ``--report`` writes
``results/trpo_reference.json`` with one table per block of seeds and variant of ours, each
side's runs on the same seeds (against the zoo's settings in ``seed_blocks``, against the
reference's other variants in ``reference_variants``), and every record names the host
(:func:`benchmarks.common.cpu_host`) and the commit. A run of ours is named by its config's
fingerprint with the ``RESULT_CHANGES`` that touch it, so code that computes otherwise starts a
fresh run; its records then replace the older ones of the same seeds in ``runs`` and the older
ones move to ``superseded`` (:func:`supersede`).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from experiments.common import RESULTS
from experiments.protocol import fingerprint
from experiments.records import (attempts_of, claimed, final_return, load_ledger, locked, provenance_of, record_run,
                                 run_timed, save_json)
from experiments.reproduce import PAPER, run_or_resume_sweep
from rlhf_jax.cli import whole_number

POINTS = 25
TARGET = 0.9
TASKS = {"hopper": "Hopper", "walker2d": "Walker2d", "halfcheetah": "HalfCheetah", "ant": "Ant",
         "swimmer": "Swimmer", "reacher": "Reacher", "invertedpendulum": "InvertedPendulum",
         "inverteddoublependulum": "InvertedDoublePendulum"}
RUNS = Path(__file__).resolve().parent.parent / "runs" / "trpo_reference"
# Published final returns of TRPO at 1M env steps, for the docs' table: sb3-contrib's TRPO with
# the RL Zoo's settings (the zoo's released agents, deterministic evaluation, v3 tasks).
PUBLISHED_RL_ZOO = {"hopper": 3673, "walker2d": 4944, "halfcheetah": 4674}


def ledger_path(side: str) -> Path:
    return RESULTS / f"trpo_reference_{side}_runs.json"


def binned_means(values: list[tuple[int, float]], steps: int, points: int = POINTS) -> list[float | None]:
    """The mean of the values recorded in each of ``points`` equal stretches of ``steps`` env
    steps, from ``(env step, value)`` pairs (an episode's return at its end, the policy's width at
    an update); None where none was recorded."""
    width = steps / points
    sums, counts = np.zeros(points), np.zeros(points)
    for step, value in values:
        index = min(points - 1, int((step - 1) // width))
        sums[index] += value
        counts[index] += 1
    return [float(s / c) if c else None for s, c in zip(sums, counts)]


def gaussian_width(entropy: float, action_dims: int) -> float:
    """The geometric mean over the action's dimensions of a diagonal Gaussian's std, from its
    entropy ``H = sum_d log(2 pi e sigma_d^2) / 2``: ``exp(H / dims - log(2 pi e) / 2)``. Both
    sides' records carry it as ``policy_width``, per stretch, as they carry the return."""
    return math.exp(entropy / action_dims - 0.5 * math.log(2 * math.pi * math.e))


# ---------------------------------------------------------------- ours
AS_CONFIGURED, AS_REFERENCE = "as configured", "the reference's settings"
ZOO = "the zoo's settings"  # the reference's variant without --reference-overrides


def variant_name(overrides: list[str], as_reference: bool = False) -> str:
    """How a run of ours differs from the figure's RL config: the reference's settings
    (``--ours-as-reference``) and its ``--ours-overrides``."""
    return " ".join([AS_REFERENCE] * as_reference + overrides) or AS_CONFIGURED


# sb3-contrib's TRPO defaults (2.9.2) that the zoo's entries leave as they are.
REFERENCE_DEFAULTS = {"target_kl": 0.01, "cg_damping": 0.1, "line_search_shrinking_factor": 0.8,
                      "sub_sampling_factor": 1, "normalize": False, "n_envs": 1}


def in_our_units(settings: dict, action_dims: int) -> list[str]:
    """The reference's settings for a task (:func:`zoo_settings`) as overrides of our TRPO.

    sb3-contrib averages its KL over the action's dimensions, so its bound and the damping it
    adds to that KL's Hessian are ``dims`` times smaller than ours for the same trust region:

        max_kl = target_kl * dims,    cg_damping = 0.1 * dims.

    VecNormalize's observations become ours standardised with its clip (10) and floor (1e-4);
    its reward scaling has no counterpart, and V's standardised targets stand in for it."""
    s = {**REFERENCE_DEFAULTS, **settings}
    if s["sub_sampling_factor"] != 1:  # it thins the whole batch, ours only the Fisher's
        raise ValueError(f"sub_sampling_factor {s['sub_sampling_factor']} has no counterpart in ours")
    batch = s["n_steps"] * s["n_envs"]
    normalize = "true" if s["normalize"] else "false"
    return [f"trpo.normalize_observations={normalize}", f"trpo.normalize_value_targets={normalize}",
            "trpo.observation_clip=10", "trpo.observation_min_std=0.0001",
            f"trpo.gamma={s['gamma']:g}", f"trpo.gae_lambda={s['gae_lambda']:g}",
            f"trpo.batch_size={batch}", f"env.num_envs={s['n_envs']}",
            f"trpo.cg_iterations={s['cg_max_steps']}", "trpo.fisher_subsample=1",
            f"trpo.max_kl={s['target_kl'] * action_dims:g}", f"trpo.cg_damping={s['cg_damping'] * action_dims:g}",
            f"trpo.line_search_decay={s['line_search_shrinking_factor']:g}",
            f"trpo.value_epochs={s['n_critic_updates']}", f"trpo.value_minibatches={batch // s['batch_size']}",
            f"trpo.value_learning_rate={s['learning_rate']:g}"]


def action_dims(task: str) -> int:
    import gymnasium

    return gymnasium.make(f"{TASKS[task]}-v5").action_space.shape[0]


def our_config(task: str, steps: int, overrides: list[str], first_seed: int = 0, control_cost: bool = True):
    from rlhf_jax.config import ExperimentConfig, load_config

    chunk = steps // POINTS
    keys = [f"env.id=envpool/{TASKS[task]}-v5", "env.num_envs=5", f"env.control_cost={str(control_cost).lower()}",
            f"seed={first_seed}",
            f"env.seed={first_seed}",
            f"trpo.total_env_steps={steps}", f"run.chunk_env_steps={chunk}", "run.checkpoint_every_updates=1",
            "run.tensorboard=false", *overrides]
    return load_config(ExperimentConfig, PAPER / "mujoco" / f"{task}_trpo.yaml", keys), keys


def run_directory(task: str, config) -> Path:
    """Where a run of ours lives: named by the config's fingerprint as the registered figures take
    it, ``RESULT_CHANGES`` included, so that code which computes otherwise starts a fresh run."""
    return RUNS / "ours" / f"{task}-{fingerprint(config)}"


def run_ours(task: str, steps: int, seeds: int, overrides: list[str], first_seed: int = 0,
             as_reference: bool = False, control_cost: bool = True) -> list[dict]:
    from rlhf_jax.config import to_dict
    from rlhf_jax.sweep import Sweep

    settings = in_our_units(zoo_settings(task), action_dims(task)) if as_reference else []
    config, keys = our_config(task, steps, settings + overrides, first_seed, control_cost)
    base = to_dict(config)
    tag = fingerprint(config)
    directory = run_directory(task, config)
    seconds = run_timed(directory, lambda: run_or_resume_sweep(directory, base, seeds))  # over every attempt
    rows = Sweep.load(directory).rows()
    records = []
    for seed in sorted({int(r["seed"]) for r in rows}):
        mine = sorted((r for r in rows if int(r["seed"]) == seed), key=lambda r: r["chunk"])
        curve = [None if math.isnan(r["episode_return"]) else r["episode_return"] for r in mine]
        width = [gaussian_width(r["entropy"], action_dims(task)) for r in mine]
        records.append({"side": "ours", "task": task, "seed": seed, "first_seed": first_seed,
                        "variant": variant_name(overrides, as_reference), "control_cost": control_cost,
                        "episode_return": curve, "policy_width": width,
                        "final_return": final_return(curve), "config": f"configs/paper/mujoco/{task}_trpo.yaml",
                        "overrides": keys, "fingerprint": tag, "seconds_all_seeds": round(seconds, 1),
                        "attempts": attempts_of(directory)})
    return records


def supersede(ledger: dict, record: dict) -> None:
    """Move the ledger's runs of ours that ``record`` replaces (the same task, variant, seed,
    budget and scoring, under another fingerprint: made by code that gave other results) from
    ``runs``, which the report reads, to ``superseded``, which keeps them in the record."""
    slot = lambda r: (r["task"], r["variant"], r["seed"], r["first_seed"], r.get("control_cost", True), r["steps"])
    for key, old in list(ledger["runs"].items()):
        if slot(old) == slot(record) and old["fingerprint"] != record["fingerprint"]:
            ledger.setdefault("superseded", {})[key] = {**old, "superseded_by": record["fingerprint"]}
            del ledger["runs"][key]


# ---------------------------------------------------------------- the reference
def zoo_table() -> dict:
    """The RL Zoo's TRPO settings, every entry, as its YAML has them (anchors merged)."""
    import rl_zoo3
    import yaml

    class ZooLoader(yaml.SafeLoader):  # the zoo's YAML merges anchors; plain safe loading does
        pass

    return yaml.load((Path(rl_zoo3.__file__).parent / "hyperparams" / "trpo.yml").read_text(), ZooLoader)


# The zoo's MuJoCo entries share one anchor, and its Ant-v4 entry is that anchor alone: the
# settings it gives a MuJoCo task it has not tuned (its YAML names the anchor "mujoco-defaults").
ZOO_MUJOCO_DEFAULTS = "Ant-v4"


def zoo_entry(table: dict, task: str) -> str:
    """The zoo's entry for the task: its own ``-v4`` entry, or, for the MuJoCo tasks the zoo has
    none for (InvertedPendulum, InvertedDoublePendulum, Reacher), :data:`ZOO_MUJOCO_DEFAULTS`."""
    own = f"{TASKS[task]}-v4"
    return own if own in table else ZOO_MUJOCO_DEFAULTS


def zoo_settings(task: str) -> dict:
    """The RL Zoo's TRPO settings for the task (:func:`zoo_entry`)."""
    table = zoo_table()
    return dict(table[zoo_entry(table, task)])


ON_ENVPOOL = "on EnvPool's task"


def reference_variant(overrides: dict, simulator: str = "gymnasium") -> str:
    """How a reference run differs from the zoo's settings on Gymnasium's task
    (``--reference-overrides``, ``--reference-on``)."""
    return " ".join([ZOO, *(f"{key}={value}" for key, value in overrides.items()),
                     *[ON_ENVPOOL] * (simulator == "envpool")])


def reference_overrides(pairs: list[str], task: str) -> dict:
    """``KEY=VALUE`` pairs as settings of sb3-contrib's TRPO; a key neither the zoo's entry for the
    task nor :data:`REFERENCE_DEFAULTS` names is refused."""
    import yaml

    if not pairs:
        return {}
    known = {**REFERENCE_DEFAULTS, **zoo_settings(task)}
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in known:
            raise ValueError(f"--reference-overrides {pair!r}: give KEY=VALUE with KEY one of "
                             f"{', '.join(sorted(known))}")
        settings[key] = yaml.safe_load(value)
    return settings


SIMULATORS = ("gymnasium", "envpool")  # whose <Task>-v5 the reference plays; ours always plays EnvPool's


def reference_env(task: str, n_envs: int, seed: int, control_cost: bool = True, simulator: str = "gymnasium"):
    """``<Task>-v5`` in ``n_envs`` copies, Gymnasium's (each copy in a ``Monitor``) or EnvPool's,
    the task ours plays (:mod:`benchmarks.sb3_envpool`, in a ``VecMonitor``); without the control
    cost, the task as figure 2 scores it (appendix A.1; every v5 task names its weight so)."""
    options = {} if control_cost else {"ctrl_cost_weight": 0.0}
    if simulator == "envpool":
        from stable_baselines3.common.vec_env import VecMonitor

        from benchmarks.sb3_envpool import EnvPoolVecEnv

        return VecMonitor(EnvPoolVecEnv(f"{TASKS[task]}-v5", n_envs, seed, **options))
    from stable_baselines3.common.env_util import make_vec_env

    return make_vec_env(f"{TASKS[task]}-v5", n_envs=n_envs, seed=seed, env_kwargs=options or None)


def run_reference(task: str, steps: int, seed: int, trace: bool = False, overrides: dict | None = None,
                  control_cost: bool = True, simulator: str = "gymnasium") -> dict:
    import sb3_contrib
    import torch
    from sb3_contrib import TRPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    table = zoo_table()
    entry = zoo_entry(table, task)
    settings = {**table[entry], **(overrides or {})}
    normalize = settings.pop("normalize", False)
    n_envs = settings.pop("n_envs", 1)
    settings.pop("n_timesteps", None)
    policy = settings.pop("policy")
    env = reference_env(task, n_envs, seed, control_cost, simulator)
    if normalize:
        env = VecNormalize(env, gamma=settings.get("gamma", 0.99))
    ends: list[tuple[int, float]] = []
    widths: list[tuple[int, float]] = []  # the geometric-mean std of the policy that collected each batch

    class EpisodeEnds(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # (Vec)Monitor's record: the raw return, before VecNormalize
                    ends.append((self.num_timesteps, float(info["episode"]["r"])))
            return True

        def _on_rollout_end(self) -> None:
            widths.append((self.num_timesteps, math.exp(self.model.policy.log_std.mean().item())))
            if trace:  # the last update's KL as sb3-contrib bounds it (per action dimension) and as ours does
                logged = self.model.logger.name_to_value
                kl, dims = logged.get("train/kl_divergence_loss", float("nan")), env.action_space.shape[0]
                print(f"{self.num_timesteps} env steps: policy std {logged.get('train/std', float('nan')):.3f}, "
                      f"KL per dimension {kl:.4f}, over the action {kl * dims:.4f}, line search success "
                      f"{logged.get('train/is_line_search_success', float('nan')):.0f}, "
                      f"explained variance {logged.get('train/explained_variance', float('nan')):.3f}", flush=True)

    start = time.perf_counter()
    model = TRPO(policy, env, seed=seed, device="cpu", verbose=0, **settings)
    model.learn(total_timesteps=steps, callback=EpisodeEnds())
    curve = binned_means(ends, steps)
    return {"side": "reference", "task": task, "seed": seed,
            "variant": reference_variant(overrides or {}, simulator), "zoo_entry": entry, "simulator": simulator,
            "control_cost": control_cost, "episode_return": curve, "policy_width": binned_means(widths, steps),
            "final_return": final_return(curve), "settings": {"normalize": normalize, "n_envs": n_envs,
                                                             "policy": policy, **settings},
            "sb3_contrib": sb3_contrib.__version__, "torch": torch.__version__,
            "seconds": round(time.perf_counter() - start, 1)}


# ---------------------------------------------------------------- the report
def bootstrap_ratio(ours: list[float], reference: list[float], draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """A 95% percentile interval of mean(ours) / mean(reference), each side's seeds resampled."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(ours), np.asarray(reference)
    ratios = (rng.choice(a, (draws, len(a))).mean(1) / rng.choice(b, (draws, len(b))).mean(1))
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def comparison(ours: list[dict], reference: list[dict]) -> dict:
    """Per task: each side's final returns, and ours over the reference with its interval."""
    rows = {}
    for task in TASKS:
        mine = [r["final_return"] for r in ours if r["task"] == task and r["final_return"] is not None]
        theirs = [r["final_return"] for r in reference if r["task"] == task and r["final_return"] is not None]
        if not mine or not theirs:
            continue
        ratio = float(np.mean(mine) / np.mean(theirs))
        rows[task] = {"ours": float(np.mean(mine)), "ours_per_seed": mine, "reference": float(np.mean(theirs)),
                      "reference_per_seed": theirs, "ratio": ratio, "ratio_95": bootstrap_ratio(mine, theirs),
                      "at_target": ratio >= TARGET, "published_rl_zoo": PUBLISHED_RL_ZOO.get(task)}
    return {"tasks": rows, "tasks_at_target": sum(r["at_target"] for r in rows.values()), "tasks_compared": len(rows)}


def report() -> dict:
    """Every variant of ours against the reference, block of seeds by block: each table sets
    one variant's runs against the reference's runs on the same seeds and the same tasks (with
    the control cost, or without it as figure 2 scores them, ``without_control_cost``)."""
    reference_all = list(load_ledger(ledger_path("reference"))["runs"].values())
    budgets = {r["steps"] for r in reference_all}
    # shorter probes of ours (what changes in the first 150k steps) are not finals to compare
    ours_all = [r for r in load_ledger(ledger_path("ours"))["runs"].values() if r["steps"] in budgets]

    def study(control_cost: bool) -> tuple[dict, dict]:
        """Against the zoo's settings, and against each other variant of the reference."""
        # records made before the option are with the control cost, as the standard tasks are
        ours = [r for r in ours_all if r.get("control_cost", True) == control_cost]
        reference = [r for r in reference_all if r.get("control_cost", True) == control_cost]

        def block_by_block(theirs_all: list[dict]) -> dict:
            """Each of our variants against these reference runs, on each block of seeds they ran."""
            tables = {}
            for first in sorted({r["first_seed"] for r in theirs_all}):
                mine = [r for r in ours if r["first_seed"] == first]
                theirs = [r for r in theirs_all if r["first_seed"] == first]
                tables[str(first)] = {v: comparison([r for r in mine if r["variant"] == v], theirs)
                                      for v in sorted({r["variant"] for r in mine})}
            return tables

        # records made before the reference had variants are the zoo's settings
        variant_of = lambda r: r.get("variant", ZOO)
        by_variant = {name: block_by_block([r for r in reference if variant_of(r) == name])
                      for name in sorted({variant_of(r) for r in reference})}
        return by_variant.pop(ZOO, {}), by_variant

    blocks, others = study(control_cost=True)
    figure_blocks, figure_others = study(control_cost=False)
    result = {"target": TARGET, "reference_host": sorted({r["cpu"] for r in reference_all}),
              "seed_blocks": blocks, "reference_variants": others,
              "without_control_cost": {"seed_blocks": figure_blocks, "reference_variants": figure_others}}
    save_json(RESULTS / "trpo_reference.json", result)
    for scoring, (zoo, variants_of) in {"": (blocks, others),
                                        ", without the control cost": (figure_blocks, figure_others)}.items():
        tables = [(ZOO, first, variants) for first, variants in zoo.items()]
        tables += [(name, first, variants) for name, by_block in variants_of.items()
                   for first, variants in by_block.items()]
        for name, first, variants in tables:
            for variant, table in variants.items():
                print(f"\nseeds from {first}{scoring}, reference: {name}, ours: {variant}\n"
                      "| task | ours | reference | ratio (95% interval) |\n| --- | ---: | ---: | ---: |")
                for task, r in table["tasks"].items():
                    print(f"| {task} | {r['ours']:.0f} | {r['reference']:.0f} | {r['ratio']:.2f} "
                          f"({r['ratio_95'][0]:.2f}-{r['ratio_95'][1]:.2f}) |")
    return result


def figure_rl_line(agent: list[str] | None = None, path: Path | None = None) -> dict | None:
    """The figure's RL agent (ours as configured, with the ``agent`` overrides a registration
    gives it) against the reference, as the last ``--report`` left it
    (``results/trpo_reference.json``): per block of seeds, each task's ratio with its interval
    and how many tasks reach the target, against the zoo's settings (``seed_blocks``) and
    against each other variant of the reference (``reference_variants``). None before any report."""
    path = path or RESULTS / "trpo_reference.json"
    if not path.exists():
        return None
    study = json.loads(path.read_text())
    ours = variant_name(agent or [])

    def this_agent(zoo: dict, variants_of: dict) -> dict:
        def blocks_of(blocks: dict) -> dict:
            return {first: variants[ours] for first, variants in blocks.items() if ours in variants}

        others = {name: blocks_of(blocks) for name, blocks in variants_of.items()}
        return {"seed_blocks": blocks_of(zoo), "reference_variants": {n: b for n, b in others.items() if b}}

    figure_scoring = study.get("without_control_cost", {"seed_blocks": {}, "reference_variants": {}})
    return {"target": study["target"], "reference_host": study["reference_host"], "agent": ours,
            **this_agent(study["seed_blocks"], study.get("reference_variants", {})),
            "without_control_cost": this_agent(figure_scoring["seed_blocks"], figure_scoring["reference_variants"])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("ours", "reference"))
    parser.add_argument("--tasks", default="hopper,walker2d,halfcheetah,ant")
    parser.add_argument("--seeds", type=whole_number(1), default=3)
    parser.add_argument("--first-seed", type=whole_number(0), default=0,
                        help="the block's first seed: 0 for probes, a fresh block (100) to confirm")
    parser.add_argument("--steps", type=whole_number(1), default=1_000_000)
    parser.add_argument("--ours-overrides", nargs="*", default=[])
    parser.add_argument("--reference-overrides", nargs="*", default=[],
                        help="the reference with other settings than the zoo's, KEY=VALUE (e.g. gamma=0.995)")
    parser.add_argument("--ours-as-reference", action="store_true",
                        help="ours with the reference's settings for each task, in our units")
    parser.add_argument("--reference-on", choices=SIMULATORS, default="gymnasium",
                        help="reference: whose task it plays, Gymnasium's or EnvPool's (the one ours plays)")
    parser.add_argument("--no-control-cost", action="store_true",
                        help="both sides: the tasks without their control cost, as figure 2 scores them")
    parser.add_argument("--report", action="store_true", help="write the table from both sides' records")
    parser.add_argument("--trace", action="store_true",
                        help="reference: print the policy's std, the KL and the line search after each update; "
                             "record nothing")
    args = parser.parse_args(argv)
    if args.report:
        report()
        return
    if args.side is None:
        parser.error("give --side ours or --side reference (or --report)")
    tasks = args.tasks.split(",")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        parser.error(f"unknown task {unknown[0]!r}; the tasks are {', '.join(TASKS)}")
    if args.trace and args.side != "reference":
        parser.error("--trace prints the reference's updates: give it with --side reference")
    if args.reference_on != "gymnasium" and args.side != "reference":
        parser.error("--reference-on chooses the reference's task: give it with --side reference")
    if args.reference_overrides and args.side != "reference":
        parser.error("--reference-overrides sets the reference's settings: give it with --side reference")
    if (args.ours_overrides or args.ours_as_reference) and args.side != "ours":
        parser.error("--ours-overrides and --ours-as-reference set our agent: give them with --side ours")
    try:
        overrides_of = {task: reference_overrides(args.reference_overrides, task) for task in tasks}
        for task in tasks if args.side == "ours" else ():
            our_config(task, args.steps, args.ours_overrides)  # a wrong key stops here, before any run
    except ValueError as error:  # ConfigError is one
        parser.error(str(error))
    if args.trace:
        for task in tasks:
            run_reference(task, args.steps, args.first_seed, trace=True, overrides=overrides_of[task],
                          control_cost=not args.no_control_cost, simulator=args.reference_on)
        return
    path = ledger_path(args.side)
    provenance = {**provenance_of("experiments.trpo_reference", argv), "steps": args.steps}
    if args.side == "reference":
        # seed by seed across the tasks, so that every task has a first comparison early
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for task in tasks:
                overrides = overrides_of[task]
                # the zoo's settings keep the keys they had before the reference had variants
                key = (f"{task}/seed{seed}" + "".join(f"/{k}={v}" for k, v in overrides.items())
                       + "/no_control_cost" * args.no_control_cost + "/envpool" * (args.reference_on == "envpool"))
                with claimed(RUNS / "claims" / key.replace("/", "_")) as mine:  # processes share a block
                    if not mine:
                        print(f"reference {task} seed {seed}: another process runs it", flush=True)
                        continue
                    done = load_ledger(path)["runs"].get(key)
                    if done is not None and done["steps"] == args.steps:
                        continue
                    record = {**run_reference(task, args.steps, seed, overrides=overrides,
                                              control_cost=not args.no_control_cost, simulator=args.reference_on),
                              "first_seed": args.first_seed, **provenance}
                    record_run(path, key, record)
                print(f"reference {task} seed {seed}: final return {record['final_return']:.0f} "
                      f"in {record['seconds'] / 60:.0f} min", flush=True)
        return
    for task in tasks:  # ours: a task's seeds are one program
        records = run_ours(task, args.steps, args.seeds, args.ours_overrides, args.first_seed, args.ours_as_reference,
                           control_cost=not args.no_control_cost)
        with locked(path):  # as the ledger is now: another process may have added to it meanwhile
            ledger = load_ledger(path)
            for record in ({**record, **provenance} for record in records):
                supersede(ledger, record)
                ledger["runs"][f"{task}/{record['fingerprint']}/seed{record['seed']}"] = record
            save_json(path, ledger)
        print(f"ours {task}: final returns {[round(r['final_return'] or float('nan')) for r in records]}", flush=True)


if __name__ == "__main__":
    main()
