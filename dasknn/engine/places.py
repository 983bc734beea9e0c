"""Model and hybrid modes: which worker holds each part of each group, kept from one pass to the next, so that a pass
after a lost worker keeps the partition, the plan and the layers the workers left still hold, and plans and loads
only the lost worker's parts again (on a new worker, or beside a part a survivor holds already)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..plan import Outline

#: A part of a group: (group, part).
Slot = tuple[int, int]


@dataclass
class HeldParts:
    """The parts the last pass placed: the partition's parts per group, its outline, each part's worker, and (where
    the layers are held in memory) the future of each part's layers."""

    parts: int = 0
    outline: Outline | None = None
    places: dict[Slot, str] = field(default_factory=dict)
    layers: dict[Slot, object] = field(default_factory=dict)

    def layers_on(self, slot: Slot, worker: str, parts: int) -> object | None:
        """The future of ``slot``'s layers where ``worker`` holds them for a partition of ``parts`` parts, else
        None."""
        if parts != self.parts or self.places.get(slot) != worker:
            return None
        return self.layers.get(slot)


def keep_places(places: dict[Slot, str], workers: list[str]) -> dict[Slot, str] | None:
    """``places`` (each part's worker, before a loss) on ``workers``: each part on its worker where that is still
    there; the others on the workers that hold none (in their order), then on those that hold fewest (a worker may
    hold several parts). None where no worker holding a part is left, or where there are more workers than parts
    (the partition is made again for them)."""
    if not places or len(workers) > len(places):
        return None
    kept = {slot: w for slot, w in places.items() if w in workers}
    if not kept:
        return None
    load = Counter(kept.values())
    free = [w for w in workers if w not in load]
    for slot in sorted(set(places) - set(kept)):
        w = free.pop(0) if free else min(workers, key=lambda w: (load[w], workers.index(w)))
        kept[slot] = w
        load[w] += 1
    return dict(sorted(kept.items()))


def most_parts(places: dict[Slot, str]) -> int:
    """The most parts one worker holds."""
    return max(Counter(places.values()).values())
