"""A run's record: the ledger that several processes add to at once."""
import subprocess
import sys
from pathlib import Path

from experiments import records

ROOT = Path(__file__).resolve().parent.parent


def test_processes_adding_to_one_ledger_at_once_lose_no_record(tmp_path):
    """Each reads the ledger, adds its record and writes it whole; without the lock, another's write
    in between is lost (and the two writers' temporary files collide)."""
    path = tmp_path / "runs.json"
    adding = ("import sys; from pathlib import Path; from experiments import records\n"
              "for i in range(40): records.record_run(Path(sys.argv[1]), f'{sys.argv[2]}{i}', {'i': i})")
    writers = [subprocess.Popen([sys.executable, "-c", adding, str(path), name], cwd=ROOT) for name in "ab"]
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0]
    assert sorted(records.load_ledger(path)["runs"]) == sorted(f"{name}{i}" for name in "ab" for i in range(40))
