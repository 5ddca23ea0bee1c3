"""How people label a run through the web page (``labeler: people`` in an experiment)."""
from __future__ import annotations

import dataclasses

from rlhf_jax.config_base import check_fields, positive
from rlhf_jax.reward.kinds import FeedbackKind


@dataclasses.dataclass(frozen=True)
class PeopleConfig:
    # One paragraph shown above the clips (Christiano et al. appendix B); "" shows a generic one
    # (the kind of feedback's: rlhf_jax.reward.kinds).
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

    def instruction_for(self, kind: FeedbackKind) -> str:
        """What the page of ``kind`` shows above its clips."""
        return self.instruction or kind.instruction
