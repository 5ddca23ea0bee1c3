"""The ``rlhf-jax`` command line."""
from __future__ import annotations

import argparse
import sys

from rlhf_jax.errors import ConfigError


def cmd_envs(args) -> None:
    """Print every environment id with its back end, observation and action space."""
    from rlhf_jax.envs import ENV_IDS, EnvConfig, make

    rows = [("id", "backend", "observation", "action space", "fps")]
    for env_id in ENV_IDS:
        if args.backend and not env_id.startswith(args.backend + "/"):
            continue
        spec = make(EnvConfig(id=env_id, num_envs=1)).spec
        observation = f"{spec.observation_dtype}{list(spec.observation_shape)}"
        rows.append((spec.id, spec.backend, observation, str(spec.action_space), f"{spec.fps:g}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf-jax", description="Reinforcement learning from human feedback in JAX.")
    commands = parser.add_subparsers(dest="command", required=True)
    envs = commands.add_parser("envs", help="list every environment id with its spaces")
    envs.add_argument("--backend", choices=("gymnax", "envpool", "mjx"), help="only this back end")
    envs.set_defaults(run=cmd_envs)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        args.run(args)
    except ConfigError as error:
        # A user's mistake: say what is wrong, without a traceback.
        print(f"rlhf-jax {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rlhf-jax {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
