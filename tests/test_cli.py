"""The command line: listing environments, and user errors without tracebacks."""
import pytest

from rlhf_jax.cli import main
from rlhf_jax.envs import ENV_IDS


def test_envs_lists_every_id_with_its_spaces(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(lines) == set(ENV_IDS)
    assert "uint8[84, 84, 4]" in lines["envpool/Pong-v5"] and "Discrete(6)" in lines["envpool/Pong-v5"]
    assert "float32[4]" in lines["gymnax/CartPole-v1"] and "Discrete(2)" in lines["gymnax/CartPole-v1"]
    assert "mjx" in lines["mjx/Hopper-v5"] and "float32[11]" in lines["mjx/Hopper-v5"]
    assert "Box(-1, 1, (3,))" in lines["mjx/Hopper-v5"]


def test_envs_filters_by_back_end(capsys):
    assert main(["envs", "--backend", "gymnax"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert ids == [i for i in ENV_IDS if i.startswith("gymnax/")]


def test_unknown_command_is_a_usage_error():
    with pytest.raises(SystemExit) as exit_:
        main(["fly"])
    assert exit_.value.code == 2
