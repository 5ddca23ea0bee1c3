"""The ``rlhf-jax`` command line."""
from __future__ import annotations

import argparse
import os
import sys

import rlhf_jax
from rlhf_jax.config_base import config_and_overrides
from rlhf_jax.errors import ConfigError, RunError


def cmd_envs(args) -> None:
    """Print every environment id with its back end, observation and action space."""
    from rlhf_jax.envs import ENV_IDS, EnvConfig, make
    from rlhf_jax.extras import MissingExtra

    rows = [("id", "backend", "observation", "action space", "fps")]
    needing: dict[str, list[str]] = {}  # an extra not installed here -> the ids that need it
    for env_id in ENV_IDS:
        if args.backend and not env_id.startswith(args.backend + "/"):
            continue
        try:
            spec = make(EnvConfig(id=env_id, num_envs=1)).spec
        except MissingExtra as missing:
            needing.setdefault(missing.extra, []).append(env_id)
            continue
        observation = f"{spec.observation_dtype}{list(spec.observation_shape)}"
        rows.append((spec.id, spec.backend, observation, str(spec.action_space), f"{spec.fps:g}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for extra, ids in needing.items():
        print(f"{len(ids)} more need pip install 'rlhf_jax[{extra}]': {', '.join(ids)}")


def format_value(value) -> str:
    """A config value as an override writes it (``a2c.mlp_hidden=[64, 64]``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(map(format_value, value)) + "]"
    if isinstance(value, str):
        return value if value else '""'
    return repr(value)


def list_keys() -> None:
    """Every config key, its type and its default, and what its field's comments say of it."""
    import textwrap

    from rlhf_jax.config import ExperimentConfig
    from rlhf_jax.config_base import describe_keys

    for key in describe_keys(ExperimentConfig):
        print(f"{key.key} = {format_value(key.default)}  ({key.type})")
        if key.comment:
            print(textwrap.fill(key.comment, width=100, initial_indent="    ", subsequent_indent="    "))


def cmd_train(args) -> None:
    # The config is read and checked before the trainer (and with it JAX) is imported: a
    # mistake in it is reported at once.
    from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, load_config

    if args.resume:
        if args.config or args.overrides:
            raise ConfigError("--resume continues a run with its saved config: give no CONFIG or overrides")
        from rlhf_jax.config_base import read_run_config

        read_run_config(args.resume)  # a directory that holds no run
        from rlhf_jax.trainer import train

        run_dir = train(resume=args.resume)
    else:
        config = load_config(ExperimentConfig, args.config, args.overrides, default=DEFAULT_EXPERIMENT)
        from rlhf_jax.trainer import train

        run_dir = train(config)
    print(f"done: {run_dir}  (learning curve: {run_dir / 'learning_curve.png'})")


def cmd_config_show(args) -> None:
    """The resolved config (CONFIG and overrides, or RUN_DIR's) as YAML that ``train`` reads back."""
    from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, build, load_config
    from rlhf_jax.config_base import dump_yaml, read_run_config, to_dict

    if args.run_dir:
        if args.config or args.overrides:
            raise ConfigError("--run RUN_DIR shows the config a run was started with: give no CONFIG or overrides")
        config = build(ExperimentConfig, read_run_config(args.run_dir))
    else:
        config = load_config(ExperimentConfig, args.config, args.overrides, default=DEFAULT_EXPERIMENT)
    print(dump_yaml(to_dict(config)), end="")


def cmd_config_keys(args) -> None:
    list_keys()


def cmd_stats(args) -> None:
    from rlhf_jax.compare import compare, table

    try:
        groups = compare(args.directories, args.by)
    except ImportError as error:
        raise ConfigError(str(error)) from None
    print(table(groups))
    left_out = sum(group.unscored for group in groups)
    if left_out:
        print(f"{left_out} run(s) left out of the statistics: their last chunk ended no episode, so they have "
              f"no final true return")


def start_distributed(coordinator: str, num_processes: int, process_id: int) -> None:
    """Join the processes of a sweep over several hosts (``jax.distributed``), before any JAX
    computation. Gathering results across processes on CPUs needs Gloo's collectives."""
    if not 0 <= process_id < num_processes:
        raise ConfigError(f"--process-id must be in [0, {num_processes}), got {process_id}")
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices only; GPUs use NCCL
    jax.distributed.initialize(coordinator, num_processes, process_id)


def sweep_definition(words: list[str]) -> tuple[dict, dict[str, list]]:
    """A new sweep's base config and swept keys (``[CONFIG] key=value ... key=v1,v2 ...``), its first
    member's config built on the way, without JAX: what the sweep would refuse at its start (a
    missing file, an unknown key, a bad value) is said before JAX is imported.
    :mod:`rlhf_jax.sweep` checks every member again."""
    from rlhf_jax.config import DEFAULT_EXPERIMENT, ExperimentConfig, apply_overrides, build, read_yaml
    from rlhf_jax.config_base import override, split_sweep_words

    config, overrides, swept = split_sweep_words(words)
    base = apply_overrides(read_yaml(config) if config else DEFAULT_EXPERIMENT, overrides)
    build(ExperimentConfig, apply_overrides(base, [override(key, values[0]) for key, values in swept.items()]))
    return base, swept


def cmd_sweep(args) -> None:
    from pathlib import Path

    if args.resume:
        if args.words:
            raise ConfigError("--resume continues a sweep with its saved definition: give no CONFIG or keys")
    else:
        if args.coordinator and not args.dir:
            raise ConfigError("a sweep over several processes needs --dir: one directory all of them share")
        base, swept = sweep_definition(args.words)
    if args.coordinator:  # before rlhf_jax's modules: importing them starts JAX's backend
        start_distributed(args.coordinator, args.num_processes, args.process_id)
    from rlhf_jax import sweep

    if args.resume:
        run = sweep.Sweep.load(Path(args.resume))
    else:
        directory = Path(args.dir) if args.dir else sweep.sweep_directory(base)
        run = sweep.Sweep.create(directory, base, swept, args.seeds)
    directory = run.run()
    print(f"done: {directory}  (table: {directory / 'results.md'}, plot: {directory / 'curves.png'})")


def cmd_eval(args) -> None:
    from rlhf_jax.trainer import evaluate_run

    evaluate_run(args.run_dir, episodes=args.episodes, seed=args.seed, videos=args.video,
                 greedy=args.greedy)  # it shows the score


def cmd_label(args) -> None:
    import os

    from rlhf_jax.feedback.webapp import serve

    serve(args.run_dir, host=args.host, port=args.port, token=args.token or os.environ.get("RLHF_JAX_TOKEN"))


def cmd_labels_export(args) -> None:
    from rlhf_jax import label_datasets

    dataset = label_datasets.from_run(args.run_dir)
    out = label_datasets.write(dataset, args.out_dir, license=args.license)
    print(f"done: {out}  ({dataset.info.rows} labels; card: {out / label_datasets.CARD_FILE})")
    if dataset.info.after_last_fit:
        print(dataset.info.untrained())


def cmd_labels_import(args) -> None:
    from rlhf_jax import label_datasets

    path = label_datasets.import_labels(args.dataset_dir, args.target)
    print(f"done: {path}")


def cmd_fit_reward(args) -> None:
    import math

    from rlhf_jax.fit_reward import fit_reward

    result = fit_reward(args.dataset_dir, args.out, args.words, epochs=args.epochs, steps=args.steps)
    validation = "" if math.isnan(result.val_loss) else f", validation loss {result.val_loss:.4f}"  # IBT holds none out
    print(f"done: {result.path}  (train loss {result.train_loss:.4f}{validation}; "
          f"start a run from it with reward_model.init_from={result.path})")


def whole_number(low: int, high: int = 10**9):
    """An argparse type: a whole number from ``low`` to ``high`` (an option that counts something
    takes 1; one whose 0 means "the default" takes 0)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:,} to {high:,}, got {value:,}")
        return value

    return parse


def config_number(key: str, what: str):
    """An option that stands for the config key ``key`` (``seed``, ``run.eval_episodes``): a
    whole number in that field's declared range, called ``what`` in messages."""

    def parse(text: str) -> int:
        import typing

        from rlhf_jax.config import ExperimentConfig  # when parsed: `rlhf-jax label` never imports JAX
        from rlhf_jax.config_base import check_value

        try:
            value = int(text)
        except ValueError:  # not a number, or more digits than int() reads
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text[:20]!r}"
                                             + ("..." if len(text) > 20 else "")) from None
        section, _, name = key.rpartition(".")
        fields = typing.get_type_hints(ExperimentConfig)[section] if section else ExperimentConfig
        try:
            check_value(fields, name, value, what)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return value

    return parse


episodes = config_number("run.eval_episodes", "the number of episodes")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf-jax", description="Reinforcement learning from human feedback in JAX.")
    parser.add_argument("--version", action="version", version=f"rlhf-jax {rlhf_jax.__version__}",
                        help="print the installed version and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    envs = commands.add_parser("envs", help="list every environment id with its spaces")
    envs.add_argument("--backend", choices=("gymnax", "envpool", "mjx"), help="only this back end")
    envs.set_defaults(run=cmd_envs)

    train = commands.add_parser("train", help="train an agent (built-in default: A2C on CartPole)")
    train.add_argument("words", nargs="*", metavar="[CONFIG] [key=value ...]",
                       help="a YAML file from configs/ and any number of overrides, e.g. env.num_envs=8")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run saved in RUN_DIR")
    train.set_defaults(run=cmd_train)

    config = commands.add_parser("config", help="show a resolved config, or every config key")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="print the resolved config as YAML, a config file train reads")
    show.add_argument("words", nargs="*", metavar="[CONFIG] [key=value ...]",
                      help="a YAML file and overrides, as train takes them (none: the built-in default)")
    show.add_argument("--run", dest="run_dir", metavar="RUN_DIR", help="the config RUN_DIR was started with")
    show.set_defaults(run=cmd_config_show)
    keys = config_commands.add_parser("keys", help="list every config key with its type, default and what it does")
    keys.set_defaults(run=cmd_config_keys)

    stats = commands.add_parser("stats", help="IQM of final true returns with stratified bootstrap intervals, "
                                              "across runs and sweeps made apart (rliable: the stats extra)")
    stats.add_argument("directories", nargs="+", metavar="RUN_OR_SWEEP_DIR", help="run or sweep directories")
    stats.add_argument("--by", action="append", default=[], metavar="KEY",
                       help="group by this config key alone (repeatable); default: by every key but seed, name, run.*")
    stats.set_defaults(run=cmd_stats)

    sweep = commands.add_parser("sweep", help="every seed and hyper-parameter combination as one compiled program")
    sweep.add_argument("words", nargs="*", metavar="[CONFIG] [key=value ...] [key=v1,v2,...]",
                       help="a config file, overrides, and keys to sweep (comma-separated values)")
    sweep.add_argument("--seeds", type=int, default=1, help="seeds per combination (config seed, seed+1, ...)")
    sweep.add_argument("--dir", help="the sweep's directory (default runs/sweep-<name>-<date>)")
    sweep.add_argument("--resume", metavar="SWEEP_DIR", help="continue the sweep saved in SWEEP_DIR")
    sweep.add_argument("--coordinator", metavar="HOST:PORT", help="jax.distributed: process 0's address")
    sweep.add_argument("--num-processes", type=int, default=1,
                       help="jax.distributed: how many processes (hosts) run the sweep together (default 1)")
    sweep.add_argument("--process-id", type=int, default=0,
                       help="jax.distributed: this process's index, 0 to --num-processes - 1 (default 0)")
    sweep.set_defaults(run=cmd_sweep)

    evaluate = commands.add_parser("eval", help="score a run's saved policy on whole true episodes")
    evaluate.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (its newest checkpoint is scored)")
    evaluate.add_argument("--episodes", type=episodes, help="episodes to score (default: run.eval_episodes)")
    evaluate.add_argument("--seed", type=config_number("seed", "the seed"), default=0,
                          help="seed of the scoring's random key: the episodes' starts and the policy's samples (default 0)")
    evaluate.add_argument("--video", type=episodes, nargs="?", const=1, default=0, metavar="N",
                          help="also write the first N scored episodes (default 1) as RUN_DIR/eval/episode_<k>.mp4; "
                               "put it after RUN_DIR")
    evaluate.add_argument("--greedy", action="store_true",
                          help="play the policy's most likely action (DQN: epsilon 0) instead of sampling it")
    evaluate.set_defaults(run=cmd_eval)

    label = commands.add_parser("label", help="serve the web page where people label a run's queries")
    label.add_argument("run_dir", metavar="RUN_DIR", help="a run trained with labeler=people")
    label.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    label.add_argument("--port", type=int, default=8000, help="port to serve on (default 8000)")
    label.add_argument("--token", help="access token every request must carry; required beyond 127.0.0.1 "
                                       "(default: $RLHF_JAX_TOKEN)")
    label.set_defaults(run=cmd_label)

    labels = commands.add_parser("labels", help="share a run's labels as a dataset (Parquet with a dataset card)")
    labels_commands = labels.add_subparsers(dest="labels_command", required=True)
    export = labels_commands.add_parser("export", help="write a finished run's labels as a dataset directory")
    export.add_argument("run_dir", metavar="RUN_DIR", help="a finished run that learned from preferences or IBT marks")
    export.add_argument("out_dir", metavar="OUT_DIR", help="the dataset directory to write (new or empty)")
    export.add_argument("--license", default="cc-by-4.0", help="the license the card states (default cc-by-4.0)")
    export.set_defaults(run=cmd_labels_export)
    load = labels_commands.add_parser("import", help="write a dataset's labels as a labels.npz, the run format")
    load.add_argument("dataset_dir", metavar="DATASET_DIR", help="a label dataset directory (rlhf-jax labels export)")
    load.add_argument("target", metavar="RUN_DIR_OR_NPZ",
                      help="a run directory (gets RUN_DIR/labels.npz) or the path of a new .npz")
    load.set_defaults(run=cmd_labels_import)

    fit = commands.add_parser("fit-reward", help="fit a reward model offline to a label dataset (preferences "
                                                 "or IBT marks), for reward_model.init_from")
    fit.add_argument("dataset_dir", metavar="DATASET_DIR",
                     help="a label dataset directory (rlhf-jax labels export) to fit the reward model to")
    fit.add_argument("words", nargs="*", metavar="[key=value ...]",
                     help="overrides of the dataset's run config, e.g. reward_model.ensemble_size=1 seed=3 "
                          "(IBT: ibt.batch_episodes=16)")
    fit.add_argument("--out", metavar="PATH", help="the .npz to write (default: DATASET_DIR-reward_model.npz beside it)")
    fit.add_argument("--epochs", type=whole_number(1), default=200, help="passes over the labels (default 200)")
    fit.add_argument("--steps", type=whole_number(0), default=0, help="fitting steps, in place of --epochs")
    fit.set_defaults(run=cmd_fit_reward)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    # Options may come between the words (`sweep CONFIG --seeds 4 key=v1,v2`): words that
    # argparse leaves over join the command's own, anything else is an error.
    args, extra = parser.parse_known_args(argv)
    if extra and (not hasattr(args, "words") or any(word.startswith("-") for word in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.words = [*args.words, *extra]
    if hasattr(args, "words") and args.command in ("train", "config"):
        args.config, args.overrides = config_and_overrides(args.words)
    command = " ".join(filter(None, (args.command, getattr(args, "labels_command", None),
                                     getattr(args, "config_command", None))))
    try:
        args.run(args)
    except ConfigError as error:
        # A user's mistake: say what is wrong, without a traceback.
        print(f"rlhf-jax {command}: error: {error}", file=sys.stderr)
        return 2
    except RunError as error:
        # A run that had to stop: the message says what is intact and how to go on.
        print(f"rlhf-jax {command}: stopped: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"rlhf-jax {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`rlhf-jax config keys | head`): nothing more to say, and Python's
        # own flush at exit must not fail on the closed pipe either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
