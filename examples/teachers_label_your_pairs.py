"""The synthetic oracle and noisy simulated teachers, labelling segment pairs of your own.

Give ``oracle_answers`` the per-step rewards of each pair's two segments (``[P, k]`` each); it
returns ``mu``, the probability that the first segment is preferred (1, 0, or 0.5 for a tie),
and ``answered``, False where the teacher says "can't tell". ``TeacherConfig`` makes the
teacher noisy in the ways studied beyond the paper: Boltzmann-rational choices, mistakes,
skipping pairs it finds uninformative, ties below a gap, and myopia. This script labels random
pairs with several teachers and says how often each agrees with the perfect oracle, then
scores the answers with the preference model's loss (equation 1 with 10% random answers).

    python examples/teachers_label_your_pairs.py --pairs 1000
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from rlhf_jax.reward import TeacherConfig, oracle_answers, preference_loss, teacher_returns

TEACHERS = {
    "perfect oracle (the paper's)": TeacherConfig(),
    "Boltzmann, temperature 0.5": TeacherConfig(boltzmann_temperature=0.5),
    "10% mistakes": TeacherConfig(mistake_prob=0.1),
    "skips pairs with both returns below 0": TeacherConfig(skip_below=0.0),
    "ties within 1.0": TeacherConfig(tie_gap=1.0),
    "myopic, gamma 0.9": TeacherConfig(myopic_gamma=0.9),
}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--length", type=int, default=25, help="steps per segment")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    key = jax.random.PRNGKey(args.seed)
    key_1, key_2, key = jax.random.split(key, 3)
    # Your segments' rewards: here each segment has a drift of its own plus noise.
    drift = jax.random.normal(key_1, (2, args.pairs, 1)) * 0.3
    reward_1, reward_2 = drift + jax.random.normal(key_2, (2, args.pairs, args.length))

    perfect, _ = oracle_answers(key, reward_1, reward_2)
    agreement = {}
    for name, teacher in TEACHERS.items():
        key, answer_key = jax.random.split(key)
        mu, answered = oracle_answers(answer_key, reward_1, reward_2, teacher)
        agree = float(jnp.sum((mu == perfect) & answered) / jnp.maximum(jnp.sum(answered), 1))
        ties = int(jnp.sum((mu == 0.5) & answered))
        agreement[name] = agree
        print(f"{name:40s} answered {int(answered.sum()):5d}  ties {ties:4d}  agrees with the oracle {agree:.1%}")

    # The preference model's loss of the perfect oracle's answers, if a reward model predicted
    # the true per-step rewards exactly: the floor that 10% random answers leave.
    loss = preference_loss(teacher_returns(reward_1, 1.0), teacher_returns(reward_2, 1.0), perfect)
    print(f"equation 1's cross-entropy at the true reward: {float(jnp.mean(loss)):.4f}")
    return agreement


if __name__ == "__main__":
    main()
