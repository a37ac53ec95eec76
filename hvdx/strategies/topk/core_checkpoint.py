"""TopK's checkpoint state: what a saved run holds, and the checks before loading it.

A TopK run's state is its step counter, autotune's timings and choice, the layout of
``selection="global"``, and the residuals (:mod:`hvdx.strategies.topk.core_memory`).
Two kinds of copy:

1. the checkpoint (:func:`checkpoint`): everything, each rank's own; loading it is
   refused (:func:`check_checkpoint`) when its residuals belong to another rank, its
   server residuals to another mode or number of ranks (a shard means nothing in
   another layout), or its residuals to another ``selection``;
2. the shared part (:func:`shared`), what every rank must hold alike, as a broadcast
   from one rank gives it: the step (it seeds the sampled threshold and ends the
   warm-up and the autotune steps: ranks at different steps would run different
   collectives), autotune's choice, the global layout, and in ``gathered`` mode the
   server residuals (every rank runs the downlink with its replica: replicas that
   differ give the ranks different updates). Not the worker residuals, nor a
   ``sharded`` server's shard: those are each rank's own. Taking it from a run of
   another mode, size or selection is refused (:func:`check_shared`).

:class:`TopKCheckpointing` gives TopK's synchronizer these as the methods of the
compression drivers' protocol (``state_dict``, ``check_state_dict``,
``load_state_dict``, ``empty_state``, ``check_saved_rank``, ``shared_state``,
``load_shared_state``, ``holds_own_state``).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

__all__ = ["Placement", "TopKCheckpointing", "check_checkpoint", "check_saved_rank",
           "check_shared", "checkpoint", "layout_from", "shared"]


class Placement(NamedTuple):
    """Where a run's residuals belong: its exchange, ranks, this rank and selection."""

    mode: str
    size: int
    rank: int
    selection: str


def _layout_list(layout) -> Optional[List[list]]:
    return None if layout is None else [list(e) for e in layout]


def layout_from(saved):
    """The layout as the memory holds it: ``((name, size), ...)``, or ``None``."""
    return None if saved is None else tuple((str(n), int(d)) for n, d in saved)


def checkpoint(placement: Placement, step: int, choice, timings, layout, worker: dict,
               server: dict) -> dict:
    """Item 1: the step, the layout the server residuals belong to, and the residuals
    (``worker``, ``server``: ``{name: array}``)."""
    return {"step": step, "mode": placement.mode, "size": placement.size,
            "rank": placement.rank, "selection": placement.selection, "choice": choice,
            "timings": [list(t) for t in timings], "layout": _layout_list(layout),
            "worker": worker, "server": server}


def check_saved_rank(state, rank: int) -> None:
    """Refuse TopK state holding another rank's residuals (``ValueError`` naming both)."""
    saved = state.get("rank")
    if saved is not None and int(saved) != rank and (state["worker"] or state["server"]):
        raise ValueError(
            f"this TopK checkpoint holds the residuals of rank {int(saved)} and this is "
            f"rank {rank}: TopK's residuals belong to the rank that accumulated them. "
            "Save a checkpoint on every rank, one file per rank (e.g. named after "
            "hvd.rank()), and load each rank's own, or use hvd.save_checkpoint / "
            "hvd.load_checkpoint, which keep every rank's state in one file")


def check_checkpoint(state, placement: Placement) -> None:
    """Raise ``ValueError`` if ``state`` may not be loaded here (item 1)."""
    check_saved_rank(state, placement.rank)
    mode, size = placement.mode, placement.size
    if state["server"] and (state["mode"], state["size"]) != (mode, size):
        raise ValueError(
            f"the checkpoint's TopK server residuals are for mode={state['mode']} on "
            f"{state['size']} ranks, this optimizer runs mode={mode} on {size}")
    selection = state.get("selection", "layerwise")
    if selection != placement.selection and (state["worker"] or state["server"]):
        raise ValueError(
            f"the checkpoint's TopK residuals are for selection={selection!r}, this "
            f"optimizer runs selection={placement.selection!r}")


def shared(placement: Placement, step: int, choice, layout,
           server: Optional[dict]) -> dict:
    """Item 2; ``server``: the server residuals in ``gathered`` mode, else ``None``."""
    return {"step": step, "choice": choice, "mode": placement.mode,
            "size": placement.size, "selection": placement.selection,
            "layout": _layout_list(layout),
            "server": server}


def check_shared(state, placement: Placement) -> None:
    """Raise ``ValueError`` if the shared ``state`` comes from another kind of run."""
    theirs = (state["mode"], state["size"], state["selection"])
    mine = (placement.mode, placement.size, placement.selection)
    if theirs != mine:
        raise ValueError(
            f"the broadcast TopK state is for mode={theirs[0]} on {theirs[1]} ranks with "
            f"selection={theirs[2]!r}; this optimizer runs mode={mine[0]} on "
            f"{mine[1]} ranks with selection={mine[2]!r}")


class TopKCheckpointing:
    """Methods of :class:`~hvdx.strategies.topk.mpi_driver.TopKSynchronizer`; they read
    its ``mode``, ``size``, ``rank``, ``selection``, ``step``, ``choice``, ``timings``
    and ``memory``."""

    def _placement(self) -> Placement:
        return Placement(self.mode, self.size, self.rank, self.selection)

    def state_dict(self) -> dict:
        """The step, the layout the server residuals belong to, and copies of the residuals."""
        return checkpoint(self._placement(), self.step, self.choice, self.timings,
                                     self.layout, self.worker.state_dict(),
                                     self.server.state_dict())

    def check_state_dict(self, state) -> None:
        """Raise what :meth:`load_state_dict` would raise, changing nothing.

        Adapters call it before loading anything else, so that a refused checkpoint
        leaves the wrapped optimizer as it was too.

        Raises:
            ValueError: see :func:`~hvdx.strategies.topk.core_check_checkpoint`.
        """
        check_checkpoint(state, self._placement())

    def load_state_dict(self, state) -> None:
        """Restore :meth:`state_dict`'s content (residuals as numpy arrays).

        Raises:
            ValueError: see :meth:`check_state_dict`; nothing is changed.
        """
        self.check_state_dict(state)
        layout = layout_from(state.get("layout"))
        self.worker.load_state_dict(state["worker"])
        self.server.load_state_dict(state["server"])
        self.memory.layout = layout
        self.step = int(state["step"])
        self.choice = state.get("choice")
        self.timings = [(float(a), float(b)) for a, b in state.get("timings", [])]

    @staticmethod
    def empty_state() -> dict:
        """The state of a run that has taken no step."""
        return {"step": 0, "mode": None, "size": None, "rank": None, "worker": {},
                "server": {}}

    check_saved_rank = staticmethod(check_saved_rank)

    def holds_own_state(self) -> bool:
        """Whether this rank holds residuals of its own, which a broadcast does not
        copy (the worker residuals: what it has not sent yet)."""
        return bool(self.worker.state_dict())

    def shared_state(self) -> dict:
        """What every rank must hold alike, as a broadcast from one rank gives it
        (:func:`~hvdx.strategies.topk.core_shared`)."""
        server = self.server.state_dict() if self.mode == "gathered" else None
        return shared(self._placement(), self.step, self.choice, self.layout,
                                 server)

    def load_shared_state(self, state) -> None:
        """Take :meth:`shared_state` from another rank (after a broadcast).

        Raises:
            ValueError: it comes from a run of another mode, size or selection;
                nothing is changed.
        """
        check_shared(state, self._placement())
        self.memory.layout = layout_from(state["layout"])
        self.step = int(state["step"])
        self.choice = state["choice"]
        if state["server"] is not None:
            self.server.load_state_dict(state["server"])
