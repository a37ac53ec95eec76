"""Error feedback: what a compressor did not send is kept and added to the next step.

Seide, Fu, Droppo, Li & Yu, "1-bit stochastic gradient descent and its application to
data-parallel distributed training of speech DNNs" (Interspeech 2014); for TopK, Stich,
Cordonnier & Jaggi, "Sparsified SGD with memory" (NeurIPS 2018). One step, for each
parameter (GRACE's ``compensate -> compress -> update``; Xu et al., "GRACE: A
compressed communication framework for distributed machine learning", ICDCS 2021)::

    a = e + g          # compensate
    s = TopK(a)        # compress (the caller)
    e <- a - s         # update: the entries sent are zeroed, the others kept

so that after T steps ``sum_t s_t + e_T == sum_t g_t`` (to float rounding).

Residuals hold the *gradient* ``g``, not ``lr * g`` (GRACE's convention; Alistarh et al.
store ``lr * g``). A residual of gradients stays meaningful when the learning rate changes
(warm-up, decay: an entry delayed by a few steps is applied at the learning rate of the
step that sends it), and the optimizer (momentum, Adam) stays outside the compressor: it
sees the sparse averaged gradient as if it were the dense one.
"""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, Mapping, Optional, Tuple

import numpy as np

__all__ = ["ResidualMemory"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class ResidualMemory:
    """Residuals ``e`` per parameter name, in a fixed order.

    The order is that of the ``names`` given, then of first use: the caller iterates its
    parameters in the same order on every rank, so :meth:`state_dict` and iteration agree
    across ranks (never a set, whose order can differ between processes). A residual
    starts at zero on first use and has the length and dtype of that first gradient:
    flat float32 or float64 (adapters upcast float16 and bfloat16 to float32).

    Example::

        memory = ResidualMemory(["fc.weight"])
        a = memory.compensate("fc.weight", g)        # e + g
        indices, values = select_exact(a, k)
        memory.update("fc.weight", a, indices, values)  # e <- a - s
    """

    __slots__ = ("_residuals", "_spare")

    def __init__(self, names: Iterable[str] = ()):
        if isinstance(names, (set, frozenset)):
            raise TypeError("names must be an ordered sequence, not a set: its order "
                            "may differ between ranks")
        self._residuals: Dict[str, Optional[np.ndarray]] = dict.fromkeys(map(str, names))
        #: A residual replaced by ``update(copy=False)``, kept as the buffer of the next
        #: ``compensate``: a large array allocated anew every step costs its page faults
        #: every step (most of ``e + g``'s time on a virtual machine).
        self._spare: Dict[str, np.ndarray] = {}

    @property
    def names(self) -> Tuple[str, ...]:
        """Parameter names in their fixed order."""
        return tuple(self._residuals)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self._residuals)

    def get(self, name: str) -> Optional[np.ndarray]:
        """The residual of ``name``, ``None`` before first use. Not a copy: do not modify
        it, and copy it to keep it, since ``update(copy=False)`` reuses its buffer two
        steps later."""
        return self._residuals.get(name)

    def set(self, name: str, residual: np.ndarray, copy: bool = True) -> None:
        """Store ``residual`` (a copy; ``copy=False``: itself, handed over) for ``name``."""
        residual = _checked(name, residual, "residual")
        self._residuals[name] = residual.copy() if copy else residual

    def check_finite(self, name: str, g: np.ndarray) -> None:
        """Raise ``ValueError`` naming ``name`` if ``g`` holds NaN or Inf.

        Called by :meth:`compensate` before the residual is read or written, so a bad
        step leaves the memory as it was (a NaN added to a residual would never leave it).
        """
        # A finite sum proves every entry finite (NaN and Inf propagate); only a sum
        # that is not finite, which an overflow can also give, needs the full check.
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(np.add.reduce(g, axis=None)):
                return
        finite = np.isfinite(g)
        if not finite.all():
            bad = int(finite.size - np.count_nonzero(finite))
            raise ValueError(f"gradient of parameter '{name}' has {bad} NaN or Inf "
                             f"value(s) of {finite.size}; its residual was left unchanged")

    def compensate(self, name: str, g: np.ndarray, checked: bool = False) -> np.ndarray:
        """Return ``a = e + g`` (a new array or the spare buffer; neither ``g`` nor ``e``
        is modified, so an error before :meth:`update` leaves the memory as it was).

        ``checked=True`` skips the NaN/Inf scan: for callers that have already proven
        ``g`` finite (the MPI synchronizer agrees on it across ranks first), where a
        second pass over a large gradient would only repeat it.

        Raises:
            ValueError: ``g`` has NaN or Inf (see :meth:`check_finite`), is not flat, or
                its length or dtype differs from the residual's.
            TypeError: ``g`` is not float32 or float64.
        """
        g = _checked(name, g, "gradient")
        if not checked:
            self.check_finite(name, g)
        e = self._residuals.get(name)
        if e is None:
            self._residuals.setdefault(name, None)
            return g.copy()
        if e.shape != g.shape or e.dtype != g.dtype:
            raise ValueError(f"gradient of parameter '{name}' is {g.dtype}[{g.size}] but "
                             f"its residual is {e.dtype}[{e.size}]")
        spare = self._spare.pop(name, None)
        if spare is None or spare.shape != e.shape or spare.dtype != e.dtype:
            return e + g
        return np.add(e, g, out=spare)

    def update(self, name: str, a: np.ndarray, sent_indices: np.ndarray,
               sent_values: np.ndarray, copy: bool = True) -> None:
        """Set ``e = a - s``: ``a`` with ``sent_values`` subtracted at ``sent_indices``.

        ``sent_indices`` must be distinct (the selectors return them so). When the values
        sent are ``a[sent_indices]``, as TopK sends them, those entries become exactly 0.
        ``copy=False`` hands ``a`` over instead of copying it (the caller owns it, as
        :meth:`compensate`'s result, and does not use it again).
        """
        e = _checked(name, a, "compensated gradient")
        e = e.copy() if copy else e
        e[sent_indices] -= sent_values
        old = self._residuals.get(name)
        self._residuals[name] = e
        if not copy and old is not None and old is not e:
            self._spare[name] = old  # get()'s callers copy what they keep (its docstring)

    def state_dict(self) -> Dict[str, np.ndarray]:
        """Copies of the residuals in the fixed order (a plain, checkpointable dict).

        Names not used yet are left out: they restart from zero, as they would have.
        """
        return {name: e.copy() for name, e in self._residuals.items() if e is not None}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Replace every residual by copies of ``state``'s.

        Names this memory knows keep their place (those ``state`` lacks restart from
        zero); new names follow in ``state``'s order.
        """
        loaded = {str(name): _checked(name, e, "residual").copy() for name, e in state.items()}
        order = dict.fromkeys(list(self._residuals) + list(loaded))
        self._residuals = {name: loaded.get(name) for name in order}
        self._spare = {}


def _checked(name: str, x: np.ndarray, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in _DTYPES:
        raise TypeError(f"{what} of parameter '{name}' is {x.dtype}; use float32 or "
                        f"float64 (upcast float16 and bfloat16 to float32)")
    if x.ndim != 1:
        raise ValueError(f"{what} of parameter '{name}' has shape {x.shape}; flatten it")
    return x
