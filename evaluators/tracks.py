"""The benchmark's tracks: the kinds of deliverable an evaluator can score.

Defined here, in the evaluator package, because that package is shipped into the
evaluator sandbox on its own; the host's vocabulary (:mod:`pytest_automedbench.terms`)
takes the tracks from this module. Standard library only.
"""

from __future__ import annotations

from typing import Literal, get_args

Track = Literal["segmentation", "enhancement", "vqa", "report", "detection", "healthagentbench"]
TRACKS: tuple[Track, ...] = get_args(Track)
