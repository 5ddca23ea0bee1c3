"""How people label a run through the web page (``labeler: people`` in an experiment)."""
from __future__ import annotations

import dataclasses

from rlhf_jax.config_base import check_fields, positive

DEFAULT_COMPARE_INSTRUCTION = (
    "Watch both clips. Choose the one in which the agent does better at its task; call it a tie "
    "when both do equally well, and 'can't tell' when you cannot judge (it will not be used).")
DEFAULT_ANNOTATE_INSTRUCTION = (
    "Play or scrub through the episode. Mark a moment of progress towards the task where it "
    "happens, and a moment of regress (a step away from it) likewise; then submit the episode, "
    "with no marks if nothing happened.")


@dataclasses.dataclass(frozen=True)
class PeopleConfig:
    # One paragraph shown above the clips (Christiano et al. appendix B); "" shows a generic one.
    instruction: str = ""
    # A query shown to one person goes back to the pool if they have not answered by then.
    assignment_timeout_s: float = positive(300.0)
    # ... or sooner, once their page has stopped saying it still shows the query (a closed
    # tab, a lost connection): an open page renews its hold every quarter of this.
    heartbeat_timeout_s: float = positive(20.0)
    # RL starts once people have answered the initial queries (the paper's order); false:
    # at once, on the reward model's random initialisation until answers come.
    wait_for_initial_labels: bool = True

    def __post_init__(self):
        check_fields(self)

    def instruction_for(self, kind: str) -> str:
        if self.instruction:
            return self.instruction
        return DEFAULT_ANNOTATE_INSTRUCTION if kind == "annotate" else DEFAULT_COMPARE_INSTRUCTION
