"""The dataset card: the ``README.md`` of a dataset directory, with the YAML front matter that
makes the directory a Hugging Face dataset repository as it stands."""
from __future__ import annotations

import json

import numpy as np

from rlhf_jax.config_base import dump_yaml, parse_yaml, to_dict
from rlhf_jax.envs.options import HOW_RUN
from rlhf_jax.label_datasets.schema import DATA_DIR, LabelDataset, columns


def size_category(rows: int) -> str:
    """The Hugging Face card's ``size_categories`` entry for ``rows`` rows."""
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if rows < limit:
            return name
    return "1M<n<10M"


def card(dataset: LabelDataset, license: str, nbytes: int) -> str:
    """The dataset card (``README.md``): YAML front matter, then what the dataset holds, how it
    was made, its fields and how to load it."""
    info, _, provenance = dataset
    kind = info.feedback
    words = kind.card
    front = {
        "license": license,
        "pretty_name": f"{words.title} labels on {info.env.id} ({info.rows} labels)",
        "task_categories": ["reinforcement-learning"],
        "tags": ["rlhf", "human-feedback", words.tag, "rlhf-jax"],
        "size_categories": [size_category(info.rows)],
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": f"{DATA_DIR}/*.parquet"}]}],
    }
    people = sorted({w for w in provenance.who if w})
    seconds = provenance.seconds[~np.isnan(provenance.seconds)]
    env_options = {k: v for k, v in to_dict(info.env).items() if k not in ("id", *HOW_RUN)}
    run = parse_yaml(info.run_config) if info.run_config else {}
    lines = [
        "---", dump_yaml(front).rstrip(), "---", "",
        f"# {front['pretty_name']}", "",
        f"{info.rows} labels: {words.what} {info.segment_length}-step segments of `{info.env.id}`, "
        f"{words.done} by "
        + (f"{len(people)} {'person' if len(people) == 1 else 'people'}" if info.labeler == "people"
           else f"a synthetic labeler ({', '.join(people) or 'unknown'})")
        + f". {nbytes / 2**20:.1f} MiB of Parquet.", "",
        "## How it was made", "",
        f"Exported with `rlhf-jax labels export` from `{info.source}`"
        + (f", where {run.get('agent', '?')} learned from {kind.learns_from} ({run.get('name', 'a run')})"
           if run else "") + ". "
        + words.made + (f" {info.untrained()}" if info.after_last_fit else ""), "",
        f"* Environment: `{info.env.id}` with options `{json.dumps(env_options)}`",
        f"* Labeler: {info.labeler}"
        + (f" ({len(people)} named; {len(seconds)} answers timed, median {np.median(seconds):.1f} s)"
           if info.labeler == "people" and len(seconds) else ""),
        f"* Observations: {info.observation_dtype} {list(info.observation_shape)}"
        + (f", stored as {info.frames_per_segment} frames of {list(info.frame_shape)} per segment "
           f"(each of the {info.stack}-frame stacks' frames once)" if info.stack > 1 else ""),
    ]
    if kind.keeps_actions:
        lines.append(f"* Actions: {info.action_dtype} {list(info.action_shape) or 'scalar'} per step")
    if info.run_config:
        lines += ["", "The source run's config:", "", "```yaml", info.run_config.rstrip(), "```"]
    lines += ["", "## Fields", "", "One row per label.", "", "| column | type [shape per row] | meaning |",
              "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.type} | {c.meaning} |" for c in columns(info)]
    if info.stack > 1:
        lines += ["", "Stacked frames are stored once: a segment of k steps keeps its first observation's "
                  f"{info.stack} frames, then each later step's newest frame. Step t's stack is "
                  "`frames[max(t + c, floor(t))]` for channels c = 0 .. stack - 1, where `floor(t)` is the "
                  "newest frame of the last restarted step at or before t (0 if none): "
                  "`rlhf_jax.reward.data.segment_stacks` rebuilds them."]
    lines += ["", "## Loading", "", "```python", "import datasets", "",
              'labels = datasets.load_dataset("parquet", data_files="data/*.parquet", split="train")',
              'row = labels.with_format("numpy")[0]  # integers come back as int64: cast with .astype',
              "```", "", "With rlhf-jax, observations rebuilt and dtypes kept:", "", "```python",
              "from rlhf_jax.label_datasets import read", "",
              "dataset = read(\"PATH/TO/THIS/DIRECTORY\")  # .info, .rows (arrays), .provenance", "```", "",
              "```bash",
              "rlhf-jax labels import THIS_DIR labels.npz              # the run format",
              "rlhf-jax fit-reward THIS_DIR --out reward_model.npz    # a reward model fitted offline",
              f"rlhf-jax train CONFIG {kind.answers_key}=THIS_DIR  # a run starting from these {words.answers}",
              "```", "", "## Citation", "", words.citation, ""]
    return "\n".join(lines)
