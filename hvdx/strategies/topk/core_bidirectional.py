"""Bidirectional TopK with error feedback, as pure functions and a one-process reference.

Zou, De Sterck & Liu, "Downlink Compression Improves TopK Sparsification", arXiv
2209.15203: TopK on the worker-to-server (uplink) *and* the server-to-worker (downlink)
path, each with its own error feedback (the DoubleSqueeze form: Tang, Yu, Lian, Zhang &
Liu, ICML 2019). With ``P`` ranks, ``d`` entries and the residuals ``e_i`` (worker ``i``)
and ``e_s`` (server), step ``t`` is:

1. uplink, on every rank ``i``: ``a_i = e_i + g_i``; ``s_i = TopK(a_i, k_up)``;
   ``e_i <- a_i - s_i``; send ``s_i`` as (index, value) pairs (:func:`uplink`).
2. aggregate: ``m = (1/P) sum_i s_i``, summed in rank order (:func:`aggregate`).
3. downlink: ``b = e_s + m``; ``u = TopK(b, k_down)``; ``e_s <- b - u``
   (:func:`downlink`).
4. every rank applies ``u`` as its averaged gradient (the optimizer is outside).

Unidirectional TopK (``downlink_ratio=None``) is the same with ``u = m`` and no ``e_s``.
Residuals hold gradients, not ``lr * g`` (see :mod:`hvdx.strategies.topk.core_error_feedback`).

There is no server: the collectives are in ``hvdx.mpi``, which calls these functions
around them in one of two modes.

- ``gathered``: one allgather of every rank's pairs; every rank then runs steps 2 and 3
  itself on the same list, in the same order, so ``m``, ``u`` and ``e_s`` are bitwise
  identical on all ranks (``e_s`` is replicated; the downlink costs no bytes). Bytes per
  rank: ``(P - 1) k_up`` pairs, growing linearly in ``P``.
- ``sharded``: ``[0, d)`` is cut into ``P`` contiguous shards (:mod:`hvdx.core.sharding`).
  An alltoall sends each shard's pairs to the rank that owns it; the owner aggregates its
  shard (rank order) and adds its shard of ``e_s``; the owners agree, with a few small
  collectives, how many of the global top ``k_down`` of ``b`` lie in each shard
  (:mod:`hvdx.strategies.topk.core_global`), and each keeps that many; an allgather of the selected
  shards gives every rank ``u``. Each rank holds only its shard of ``e_s``. With
  ``topk_method="exact"`` ``u`` is the global TopK of ``b``, bitwise what gathered mode computes
  (zero entries are never sent), even where the large entries cluster in one shard.
  Unidirectional sharded allgathers every non-zero of each shard of ``m``. Bytes per
  rank: ``(P - 1)/P (k_up + k_down)`` pairs plus ``O(P)`` numbers per round of the
  agreement, flat in ``P``.

:func:`simulate_step` runs all ``P`` ranks in one process: the numpy reference that the
MPI layer and the framework adapters are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from hvdx.strategies.topk.core_error_feedback import ResidualMemory
from hvdx.strategies.topk import core_global as global_topk
from hvdx.core.sharding import shard_bounds, split_by_shard
from hvdx.core.validation import check_integer
from hvdx.strategies.topk.core_selection import (
    DEFAULT_SAMPLE_SIZE,
    check_ratio,
    k_for,
    select_exact,
    select_threshold,
)

__all__ = [
    "MODES",
    "TOPK_METHODS",
    "TOPK_METHOD_ALIASES",
    "StepResult",
    "StepStats",
    "TopKConfig",
    "Traffic",
    "aggregate",
    "canonical_topk_method",
    "compensate_server",
    "dense_allreduce_bytes",
    "downlink",
    "downlink_from",
    "gathered_bytes",
    "select",
    "selection_rng",
    "sharded_bytes",
    "simulate_step",
    "step_bytes",
    "to_dense",
    "uplink",
]

MODES = ("gathered", "sharded")
#: How the top ``k`` entries are found: exactly, or above DGC's sampled threshold.
TOPK_METHODS = ("exact", "sampled_threshold")
#: Old ``topk_method`` values (it was called ``selector``), accepted for the new ones.
TOPK_METHOD_ALIASES = {"threshold": "sampled_threshold"}
_ROLES = {"up": 0, "down": 1}

Sparse = Tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class TopKConfig:
    """Settings every rank must share (they belong in the fingerprint).

    Args:
        ratio: uplink fraction kept, in (0, 1]: ``k_up = max(1, ceil(ratio * d))``.
        downlink_ratio: downlink fraction in (0, 1], or ``None`` for unidirectional TopK.
        topk_method: ``"exact"`` (:func:`~hvdx.strategies.topk.core_selection.select_exact`) or
            ``"sampled_threshold"`` (:func:`~hvdx.strategies.topk.core_selection.select_threshold`);
            the old value ``"threshold"`` is stored as ``"sampled_threshold"``.
        sample_size: the most entries the sampled threshold looks at.
        seed: seeds the sampled threshold's generators (:func:`selection_rng`).
    """

    ratio: float
    downlink_ratio: Optional[float] = None
    topk_method: str = "exact"
    sample_size: int = DEFAULT_SAMPLE_SIZE
    seed: int = 0

    def __post_init__(self):
        check_ratio(self.ratio)
        if self.downlink_ratio is not None:
            check_ratio(self.downlink_ratio, "downlink_ratio")
        # One spelling per setting: equality, describe() and the fingerprint compare it.
        object.__setattr__(self, "topk_method",
                           canonical_topk_method(self.topk_method, "topk_method"))
        for name, low in (("sample_size", 1), ("seed", 0)):
            object.__setattr__(self, name,
                               check_integer(name, getattr(self, name), low, at_least=">="))

    @property
    def bidirectional(self) -> bool:
        return self.downlink_ratio is not None

    def k_up(self, size: int) -> int:
        """Pairs each rank sends for a vector of ``size`` entries."""
        return k_for(self.ratio, size)

    def k_down(self, size: int) -> Optional[int]:
        """Pairs of the downlink update, or ``None`` when unidirectional."""
        return None if self.downlink_ratio is None else k_for(self.downlink_ratio, size)

    def downlink_pairs(self, size: int, n_ranks: int) -> int:
        """Most pairs in ``u``: ``k_down``, or ``min(d, P k_up)`` when unidirectional."""
        k_down = self.k_down(size)
        return min(size, n_ranks * self.k_up(size)) if k_down is None else k_down


def canonical_topk_method(value: object, argument: str = "topk_method") -> str:
    """``value`` as one of :data:`TOPK_METHODS` (old values mapped), else ``ValueError``
    naming ``argument`` and ``value``."""
    value = TOPK_METHOD_ALIASES.get(value, value) if isinstance(value, str) else value
    if value not in TOPK_METHODS:
        raise ValueError(f"{argument}={value!r} must be one of {TOPK_METHODS}")
    return value


def selection_rng(seed: int, step: int, role: str, index: int = 0,
                  tensor: int = 0) -> np.random.Generator:
    """The generator of one selection, a pure function of its arguments.

    ``role`` is ``"up"`` (``index`` = the rank) or ``"down"`` (``index`` = the shard, 0
    in gathered mode); ``tensor`` numbers the tensors when each is selected separately.
    Every rank that computes the gathered downlink builds the same generator, so the
    sampled threshold samples the same positions everywhere and ``u`` stays identical.
    """
    return np.random.default_rng([int(seed), int(step), _ROLES[role], int(index), int(tensor)])


def select(x: np.ndarray, k: int, config: Optional[TopKConfig] = None,
           rng: Optional[np.random.Generator] = None) -> Sparse:
    """TopK of ``x`` with the configured ``topk_method`` (exact when ``config`` is
    ``None``)."""
    if config is None or config.topk_method == "exact":
        return select_exact(x, k)
    if rng is None:
        raise ValueError("topk_method='sampled_threshold' needs rng (see selection_rng)")
    return select_threshold(x, k, rng, config.sample_size)


def uplink(memory: ResidualMemory, name: str, g: np.ndarray, k_up: int,
           config: Optional[TopKConfig] = None,
           rng: Optional[np.random.Generator] = None, checked: bool = False) -> Sparse:
    """Step 1 on one rank: compensate, select, update the residual; return the pairs.

    Raises ``ValueError`` naming ``name``, memory untouched, if ``g`` has NaN or Inf
    (``checked=True``: the caller has already proven ``g`` finite; no second scan).
    """
    a = memory.compensate(name, g, checked=checked)  # a new array: the memory may keep it
    indices, values = select(a, k_up, config, rng)
    memory.update(name, a, indices, values, copy=False)
    return indices, values


def aggregate(sparse_list: Sequence[Sparse], size: int, n_ranks: int, offset: int = 0,
              dtype=None) -> np.ndarray:
    """Step 2: ``m = (1/P) sum_i s_i`` as a dense vector of ``size`` entries.

    ``sparse_list`` holds every rank's ``(indices, values)`` in rank order (indices
    distinct within a pair). Each entry is summed in that order, then divided by ``P``:
    float addition is not associative, and this fixed order is what makes ``m`` bitwise
    identical on every rank that aggregates the same list. ``offset`` is subtracted from
    the indices (the first index of a shard).
    """
    if len(sparse_list) != n_ranks:
        raise ValueError(f"sparse_list has {len(sparse_list)} entries for n_ranks={n_ranks}")
    if dtype is None:
        dtype = np.result_type(*(values for _, values in sparse_list))
    m = np.zeros(size, dtype)
    for indices, values in sparse_list:
        m[np.asarray(indices) - offset] += values
    m /= n_ranks
    return m


def downlink(m: np.ndarray, server_residual: Optional[np.ndarray], k_down: int,
             config: Optional[TopKConfig] = None,
             rng: Optional[np.random.Generator] = None
             ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 3: ``b = e_s + m``; ``u = TopK(b, k_down)``; ``e_s <- b - u``.

    ``server_residual`` ``None`` means zero (the first step). In sharded mode, ``m`` and
    the residual are one shard and the returned indices are relative to it.

    Returns:
        ``(u_indices, u_values, new_server_residual)``; the inputs are not modified.
    """
    return downlink_from(compensate_server(m, server_residual), k_down, config, rng)


def compensate_server(m: np.ndarray, server_residual: Optional[np.ndarray]) -> np.ndarray:
    """``b = e_s + m``, a new array (``None``: a zero residual)."""
    if server_residual is None:
        return m.copy()
    if server_residual.shape != m.shape or server_residual.dtype != m.dtype:
        raise ValueError(f"server residual is {server_residual.dtype}"
                         f"{list(server_residual.shape)} but m is {m.dtype}{list(m.shape)}")
    return server_residual + m


def downlink_from(b: np.ndarray, k_down: int, config: Optional[TopKConfig] = None,
                  rng: Optional[np.random.Generator] = None
                  ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The selection half of :func:`downlink`: ``u = TopK(b, k_down)``; ``b`` itself
    becomes the new residual ``b - u`` and is returned as the third element."""
    indices, values = select(b, k_down, config, rng)
    b[indices] -= values  # b becomes the new residual: the entries sent are exactly 0
    return indices, values, b


def to_dense(indices: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """The dense vector of ``size`` entries holding ``values`` at ``indices``."""
    dense = np.zeros(size, np.asarray(values).dtype)
    dense[indices] = values
    return dense


# --- bytes ------------------------------------------------------------------------------

class Traffic(NamedTuple):
    """Bytes one rank sends and receives in one step."""

    sent: float
    received: float


def gathered_bytes(k_up: int, n_ranks: int, index_bytes: int = 4,
                   value_bytes: int = 4) -> Traffic:
    """Gathered mode: an allgather of ``k_up`` pairs per rank, ``(P - 1) k_up`` pairs each way.

    The same with or without the downlink, which every rank computes locally.
    """
    pairs = (n_ranks - 1) * k_up
    return Traffic(pairs * (index_bytes + value_bytes), pairs * (index_bytes + value_bytes))


def sharded_bytes(k_up: int, k_down: int, n_ranks: int, index_bytes: int = 4,
                  value_bytes: int = 4) -> Traffic:
    """Sharded mode: alltoall of ``k_up`` pairs, allgather of ``k_down`` pairs in all.

    Assumes the selected indices spread evenly over the shards: each rank keeps ``1/P``
    of its pairs and of ``u`` local, so ``(P - 1)/P (k_up + k_down)`` pairs each way
    (direct or ring allgather alike). Unidirectional: pass ``k_down = min(d, P k_up)``
    (:meth:`TopKConfig.downlink_pairs`). Not counted: the alltoall's ``P`` counts.
    """
    pairs = (n_ranks - 1) / n_ranks * (k_up + k_down)
    return Traffic(pairs * (index_bytes + value_bytes), pairs * (index_bytes + value_bytes))


def dense_allreduce_bytes(size: int, n_ranks: int, value_bytes: int = 4) -> float:
    """Bytes a rank sends (and receives) in a ring allreduce of ``size`` values."""
    return 2 * (n_ranks - 1) / n_ranks * size * value_bytes


def step_bytes(config: TopKConfig, size: int, n_ranks: int, mode: str,
               index_bytes: int = 4, value_bytes: int = 4) -> Traffic:
    """:func:`gathered_bytes` or :func:`sharded_bytes` for ``config`` on ``size`` entries."""
    k_up = config.k_up(size)
    if _mode(mode) == "gathered":
        return gathered_bytes(k_up, n_ranks, index_bytes, value_bytes)
    return sharded_bytes(k_up, config.downlink_pairs(size, n_ranks), n_ranks, index_bytes,
                         value_bytes)


# --- the one-process reference -----------------------------------------------------------

class StepStats(NamedTuple):
    """What one simulated step moved."""

    #: Pairs each rank selected and sent (``<= k_up``).
    nnz_up: Tuple[int, ...]
    #: Non-zeros of the aggregate ``m`` (``<= min(d, P k_up)``).
    nnz_m: int
    #: Pairs in the downlink update ``u`` (``<= k_down``; unidirectional: the non-zeros
    #: of ``m``).
    nnz_down: int
    #: Bytes each rank received from the others (4-byte indices and values); what a
    #: rank sends depends on the collective's algorithm (:class:`Traffic` models it).
    recv_bytes: Tuple[int, ...]


class StepResult(NamedTuple):
    """One simulated step: what every rank applies, and what it was made of."""

    #: The update ``u`` every rank applies (rank 0's copy), dense.
    u: np.ndarray
    #: ``u`` as each rank computed (gathered) or assembled (sharded) it.
    updates: Tuple[np.ndarray, ...]
    #: The aggregate ``m``, dense (in sharded mode assembled from the owners' shards).
    m: np.ndarray
    #: Each rank's uplink pairs ``s_i``, in rank order.
    sent: Tuple[Sparse, ...]
    stats: StepStats


def simulate_step(grads_per_rank: Sequence[np.ndarray],
                  worker_memories: Sequence[ResidualMemory],
                  server_state: Optional[Sequence[ResidualMemory]],
                  config: TopKConfig, mode: str = "gathered", *, step: int = 0,
                  name: str = "grad") -> StepResult:
    """Run one step of all ``P`` ranks in this process (the numpy reference).

    1. Check every rank's gradient first: a NaN or Inf anywhere raises ``ValueError``
       naming ``name`` before any residual changes.
    2. Uplink on each rank ``i`` with ``worker_memories[i]`` (:func:`uplink`).
    3. gathered: each rank ``r`` aggregates the rank-ordered list and, if bidirectional,
       runs :func:`downlink` with its own replica ``server_state[r]`` of ``e_s``.
       sharded: rank ``s`` aggregates shard ``s`` from the pieces every rank sent it and,
       if bidirectional, adds its shard of ``e_s`` (``server_state[s]``) and keeps its
       share of the global top ``k_down`` (:func:`hvdx.strategies.topk.core_global.shares`); every
       rank assembles ``u`` from all shards.
    4. Return ``u`` (rank 0's), every rank's copy, ``m``, the pairs sent and
       :class:`StepStats`.

    Args:
        grads_per_rank: one flat float32/float64 gradient of ``d`` entries per rank.
        worker_memories: one :class:`ResidualMemory` per rank.
        server_state: one :class:`ResidualMemory` per rank for ``e_s`` (ignored, may be
            ``None``, when unidirectional). Keep using it with one mode only.
        config: the shared settings.
        mode: ``"gathered"`` or ``"sharded"``.
        step: the step number (seeds the sampled threshold through :func:`selection_rng`).
        name: the residuals' key in the memories.
    """
    mode = _mode(mode)
    grads = [np.asarray(g) for g in grads_per_rank]
    n_ranks = len(grads)
    if n_ranks == 0 or len(worker_memories) != n_ranks:
        raise ValueError(f"need one gradient and one worker memory per rank, got "
                         f"{n_ranks} and {len(worker_memories)}")
    if config.bidirectional and (server_state is None or len(server_state) != n_ranks):
        raise ValueError("bidirectional TopK needs one server_state memory per rank")
    if len({(g.shape, g.dtype) for g in grads}) != 1:
        raise ValueError("every rank's gradient must have the same shape and dtype")
    if grads[0].ndim != 1 or grads[0].dtype not in (np.float32, np.float64):
        raise ValueError(f"gradients must be flat float32 or float64, got "
                         f"{grads[0].dtype}{list(grads[0].shape)}")
    for memory, g in zip(worker_memories, grads):
        memory.check_finite(name, g)
    size, pair = grads[0].size, 8
    threshold = config.topk_method == "sampled_threshold"

    def rng(role, index):
        return selection_rng(config.seed, step, role, index) if threshold else None

    k_up, k_down = config.k_up(size), config.k_down(size)
    sent = [uplink(memory, name, g, k_up, config, rng("up", i))
            for i, (memory, g) in enumerate(zip(worker_memories, grads))]
    nnz_up = tuple(len(indices) for indices, _ in sent)

    if mode == "gathered":
        updates, nnz_m, nnz_down = [], 0, 0
        for r in range(n_ranks):  # every rank computes m and u itself
            m = aggregate(sent, size, n_ranks)
            nnz_m = int(np.count_nonzero(m))
            if k_down is None:
                updates.append(m)
                nnz_down = nnz_m
                continue
            memory = server_state[r]
            indices, values, residual = downlink(m, memory.get(name), k_down, config,
                                                 rng("down", 0))
            memory.set(name, residual)
            updates.append(to_dense(indices, values, size))
            nnz_down = len(indices)
        total = sum(nnz_up)
        recv = tuple((total - own) * pair for own in nnz_up)
        return StepResult(updates[0], tuple(updates), m, tuple(sent),
                          StepStats(nnz_up, nnz_m, nnz_down, recv))

    bounds = shard_bounds(size, n_ranks)
    pieces = [split_by_shard(indices, values, bounds) for indices, values in sent]
    selected: List[Sparse] = []
    shards_of_m = [aggregate([pieces[i][s] for i in range(n_ranks)],
                             int(bounds[s + 1] - bounds[s]), n_ranks, offset=int(bounds[s]),
                             dtype=grads[0].dtype)
                   for s in range(n_ranks)]  # rank s owns shard s
    if k_down is None:
        for s, m_s in enumerate(shards_of_m):
            local = np.flatnonzero(m_s)
            selected.append((local + int(bounds[s]), m_s[local]))
    else:
        b = [compensate_server(m_s, server_state[s].get(name))
             for s, m_s in enumerate(shards_of_m)]
        for s, share in enumerate(global_topk.shares(b, k_down)):  # the global top k_down
            local, values, residual = downlink_from(b[s], int(share), config,
                                                    rng("down", s))
            server_state[s].set(name, residual)
            selected.append((local + int(bounds[s]), values))
    u = to_dense(np.concatenate([i for i, _ in selected]),
                 np.concatenate([v for _, v in selected]), size)
    down = [len(indices) for indices, _ in selected]
    recv = tuple(pair * (sum(len(pieces[i][s][0]) for i in range(n_ranks) if i != s)
                         + sum(down) - down[s]) for s in range(n_ranks))
    m = np.concatenate(shards_of_m)
    return StepResult(u, (u,) * n_ranks, m, tuple(sent),
                      StepStats(nnz_up, int(np.count_nonzero(m)), sum(down), recv))


def _mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of {MODES}")
    return mode
