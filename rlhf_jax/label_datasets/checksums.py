"""``SHA256SUMS``: each data file's SHA-256, written by the export and checked before a dataset
is read. Parquet's pages carry no checksum of their own, so one flipped byte can read back as
another answer; here it is refused instead, naming the file. The format is ``sha256sum``'s, so
``sha256sum -c SHA256SUMS`` checks a dataset by hand. The card is left out: people edit it."""
from __future__ import annotations

import hashlib
from pathlib import Path

from rlhf_jax.errors import ConfigError

SUMS_FILE = "SHA256SUMS"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(2**20):
            digest.update(block)
    return digest.hexdigest()


def write_sums(directory: Path, files: list[Path]) -> None:
    """``directory/SHA256SUMS``, one line per file of ``files`` (inside ``directory``)."""
    lines = [f"{sha256(path)}  {path.relative_to(directory).as_posix()}\n" for path in files]
    (directory / SUMS_FILE).write_text("".join(lines), encoding="utf-8")


def check_sums(directory: Path, files: list[Path]) -> None:
    """Refuse ``files`` unless ``directory/SHA256SUMS`` lists each of them, and nothing else,
    with the SHA-256 it has now."""
    sums = directory / SUMS_FILE
    if not sums.is_file():
        raise ConfigError(f"{directory} has no {SUMS_FILE}, the checksums its files are read against: "
                          f"export it again, or write one (sha256sum data/*.parquet > {SUMS_FILE})")
    listed = {}
    for number, line in enumerate(sums.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        digest, marker, name = line[:64], line[64:66], line[66:]
        if len(digest) != 64 or marker not in ("  ", " *") or not name:
            raise ConfigError(f"{sums}: line {number} is not a SHA-256 and a file name, as sha256sum writes them")
        listed[name] = digest.lower()
    names = {path.relative_to(directory).as_posix(): path for path in files}
    for name, path in names.items():
        if name not in listed:
            raise ConfigError(f"{path} is not in {sums}: a file the export did not write")
        if sha256(path) != listed[name]:
            raise ConfigError(f"{path} is damaged: its SHA-256 is not the one {sums} gives")
    gone = sorted(name for name in listed if name not in names and not (directory / name).is_file())
    if gone:
        raise ConfigError(f"{directory / gone[0]}, which {sums} lists, is missing")
