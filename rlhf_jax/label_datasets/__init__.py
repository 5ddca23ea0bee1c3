"""Label datasets: the answers a run learned from, as Apache Parquet files anyone can load.

A run keeps its labels in ``labels.npz`` (and, with people, who answered and how fast in
``labels.sqlite``): right for the run, opaque to anyone else. ``rlhf-jax labels export RUN_DIR
OUT_DIR`` writes them as a dataset directory::

    OUT_DIR/README.md                           the dataset card: what, how made, fields, how to load
    OUT_DIR/SHA256SUMS                          each data file's SHA-256, checked before it is read
    OUT_DIR/data/train-00000-of-00001.parquet   one row per label (more files for large datasets)

which ``datasets.load_dataset("parquet", data_files="OUT_DIR/data/*.parquet")`` loads, as do
pyarrow and pandas; the card's YAML front matter makes the directory a Hugging Face dataset
repository as it stands. :func:`columns` lists the columns, and the card shows them.

* **Frames once.** An Atari observation stacks the 4 newest frames, so a segment's ``k``
  stacks hold ``k + 3`` distinct frames: the dataset stores those and each step's ``restart``
  flag, as the label database does (:mod:`rlhf_jax.reward.data`), and the stacks are rebuilt
  on load (:func:`~rlhf_jax.reward.data.segment_stacks`), bit for bit. Other observations are
  stored whole (a "frame" is then the observation).
* **Bit for bit.** Observations, actions, answers (``mu``: 1 left preferred, 0 right, 0.5
  tie), IBT marks, oracle returns and held-out flags keep their dtypes: ``rlhf-jax labels
  import`` writes back a ``labels.npz`` equal to the run's own.
* **Who answered.** From ``labels.sqlite`` for a run labelled by people (its answers are
  matched to the labels by their segments), else the synthetic labeler's name (``oracle``,
  or the teacher's or annotator's settings) and no seconds. Labels a run was given from
  another dataset (``preferences.labels_from``, ``ibt.marks_from``) keep that dataset's ``who``.
  Answers in the store that the run never trained on (given after its last fit) follow its
  own labels, counted in :attr:`DatasetInfo.after_last_fit`: no answer is left out.
* **What it was made on.** Each Parquet file's schema metadata holds a :class:`DatasetInfo`
  (as JSON under :data:`~rlhf_jax.label_datasets.schema.METADATA_KEY`): the environment's config section, shapes and
  dtypes, the labeler, and the source run's ``config.yaml`` (less the keys that name files:
  a dataset records no local path and chooses no file to read). A run or a fit reads it to
  refuse labels made on another environment, naming the key that differs.
* **Checked before trusted.** Reading a dataset checks its files' checksums, each column's
  type (exactly the metadata's: nothing is cast) and every value (answers and marks in their
  sets, numbers finite, actions in the task's action space), and refuses it in one line
  naming the file, or the column and row.

:func:`load_labels` reads any of a dataset directory, a finished run's directory, or a
``labels.npz`` (a run's, or one ``labels import`` wrote, which carries its :class:`DatasetInfo`).

The modules: :mod:`~rlhf_jax.label_datasets.schema` (what a dataset is), ``check`` (what a
dataset must be to be trusted), ``parquet`` (the dataset directory's files), ``checksums``
(its ``SHA256SUMS``), ``card`` (its README), ``npz`` (the run format) and ``load`` (labels
from wherever they are kept, with who gave them).
"""
from rlhf_jax.label_datasets.check import check_actions
from rlhf_jax.label_datasets.load import from_run, labels_info, load_labels
from rlhf_jax.label_datasets.npz import import_labels, write_labels_npz
from rlhf_jax.label_datasets.parquet import ZSTD_LEVEL, parquet_bytes, read, read_info, shard_files, write
from rlhf_jax.label_datasets.schema import CARD_FILE, DatasetInfo, LabelDataset, LabelRows, Provenance, columns

__all__ = ["CARD_FILE", "ZSTD_LEVEL", "DatasetInfo", "LabelDataset", "LabelRows", "Provenance", "check_actions",
           "columns", "from_run", "import_labels", "labels_info", "load_labels", "parquet_bytes", "read", "read_info",
           "shard_files", "write", "write_labels_npz"]
