"""Blank out on-screen scores in Atari observations (Christiano et al. 2017, appendix A.2).

"Atari games include a visual display of the score ... we replace the score area with
a constant black background on all seven games. On BeamRider we additionally blank out
the enemy ship count, and on Enduro we blank out the speedometer."

Regions are given in EnvPool's Mnih-2015 84x84 frame: the whole 210x160 screen
resized, so an emulator pixel (y, x) lands near (0.4 y, 0.525 x). Each was found by
rendering the game at 210x160 and 84x84, viewing the frames and diffing frames taken
around rewards; each covers every digit the display can show (also digits that only
appear with large scores) with about a pixel of margin.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Region(NamedTuple):
    """Rows ``[row_start, row_stop)`` and columns ``[col_start, col_stop)`` of an 84x84 frame."""

    what: str
    row_start: int
    row_stop: int
    col_start: int
    col_stop: int


HIDDEN_REGIONS: dict[str, tuple[Region, ...]] = {
    # Six-digit score with leading zeros, centred at the top (digits rows 4-7, cols 32-56);
    # the "SECTOR nn" line below (rows 8-11) stays. Enemies left to destroy this sector
    # (15 down to 0, right-aligned) sit under the score on the left (rows 12-15, cols
    # 10-16); the torpedoes left at the top right are not hidden.
    "BeamRider": (
        Region("score", 3, 8, 31, 58),
        Region("enemy ships left", 11, 17, 9, 18),
    ),
    # Three-digit score with leading zeros (rows 2-5, cols 18-41), left of the lives digit
    # (cols 52-58) and the player number (col 73), which stay; the grey wall starts at row 6.
    "Breakout": (Region("score", 1, 6, 17, 44),),
    # Scores of the computer (left, tens cols 10-17, units 18-25) and of the agent (right,
    # tens 52-59, units 60-67) in the band above the top wall (rows 0-8; wall from row 9).
    "Pong": (
        Region("score (computer)", 0, 9, 9, 27),
        Region("score (agent)", 0, 9, 51, 69),
    ),
    # Five-digit score with leading zeros (rows 2-5, cols 17-37; a sixth digit would go at
    # cols 13-16). The lives icons below it (rows 6-11) stay; sprites at the top of the
    # pyramid reach col 38 of rows 4-5, so the margin on the right is one pixel.
    "Qbert": (Region("score", 1, 6, 12, 39),),
    # Right-aligned score, units digit at cols 51-55, up to six digits (cols 31-55), rows
    # 3-6 over the sky; the reserve submarines (row 8 on) stay.
    "Seaquest": (Region("score", 2, 8, 29, 57),),
    # Four-digit scores with leading zeros: player 1 on the left (cols 2-33), player 2 on
    # the right (cols 44-75; stays 0000 in a one-player game), rows 4-7. The mothership
    # (rows 5-7) and the agent's shots cross this band, and are hidden while over a score.
    "SpaceInvaders": (
        Region("score (player 1)", 3, 9, 1, 35),
        Region("score (player 2)", 3, 9, 43, 77),
    ),
    # The dashboard below the road (rows 64-76, cols 25-58). Top line: the odometer,
    # whose last digits roll at a rate set by the car's speed (the speedometer; rows
    # 65-69). Bottom line: day number and the cars-left-to-pass counter, which is what the
    # reward counts (rows 71-75). Both lines span cols 29-55.
    "Enduro": (
        Region("speedometer (odometer)", 64, 71, 28, 56),
        Region("score (day, cars left to pass)", 71, 77, 28, 56),
    ),
}


@functools.lru_cache(maxsize=None)
def visible_pixels(game: str) -> np.ndarray:
    """A (84, 84, 1) boolean mask: False on ``game``'s hidden regions."""
    visible = np.ones((84, 84, 1), bool)
    for r in HIDDEN_REGIONS[game.split("-")[0]]:
        visible[r.row_start : r.row_stop, r.col_start : r.col_stop] = False
    return visible


def hide_score(obs: jax.Array, game: str) -> jax.Array:
    """Set ``game``'s score regions to 0 in every frame of ``obs``, shape ``(..., 84, 84, stack)``.

    ``game`` is a key of ``HIDDEN_REGIONS`` ("Pong"); an EnvPool id ("Pong-v5") also works.
    One elementwise select against a constant mask, which XLA fuses with whatever
    produced ``obs`` (the transpose to channel-last): no extra pass over the frames.
    """
    return jnp.where(visible_pixels(game), obs, jnp.zeros((), jnp.asarray(obs).dtype))
