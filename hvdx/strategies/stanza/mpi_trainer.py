"""A Stanza trainer's life, written once for every framework: construction, step, whole model.

Stanza (Wu, Xu, Li, Xiong, arXiv 1812.10624): conv workers train the feature extractor,
FC workers the head (roles: :mod:`hvdx.strategies.stanza.core_roles`). :class:`StanzaTrainer`
is the base of ``hvdx.torch.Stanza`` (:mod:`hvdx.strategies.stanza.torch.trainer`) and
``hvdx.tensorflow.Stanza`` (:mod:`hvdx.strategies.stanza.tensorflow.trainer`); it holds
what does not touch a tensor, and each subclass supplies its framework's hooks (below):

1. construction (:meth:`StanzaTrainer._start`): the two parts from either form of the
   arguments and the settings are checked on each rank (``_take_parts``,
   :func:`hvdx.strategies.stanza.core_checks.check_settings`); every rank's model and
   settings, and any error, go into one fingerprint
   (:func:`hvdx.strategies.stanza.mpi_setup.agree_on_arguments`), so a bad argument
   raises the same ``ValueError`` everywhere; where the framework asks for it, the
   ranks agree on whether ``head(features(example))`` runs (``_fit_error``); with
   ``fc_workers="auto"`` the probe chooses the roles
   (:func:`hvdx.strategies.stanza.mpi_setup.probe_roles`, ``_probe``); then the
   exchange, the step's protocol (:class:`hvdx.strategies.stanza.mpi_step.StanzaStep`,
   its framework adapter from ``_new_adapter``), and the start: the conv workers take
   rank 0's features, the FC workers rank 0's head (``_part_bytes``, ``_part_size``,
   ``_load_part``);
2. a step (:meth:`StanzaTrainer.step`): the optimizer's gradients cleared
   (``_zero_gradients``), the conv worker's batch split into micro-batches
   (:func:`hvdx.strategies.stanza.core_checks.split_batch`, ``_lengths``) and run by the
   protocol, the role's gradients applied (``_apply_gradients``), the step counted;
3. the whole model on one rank (:meth:`StanzaTrainer.full_model`): the target rank makes
   an empty copy (``_model_shell``; a failure there fails every rank alike), the ranks
   agree on the target, each part comes from the first rank of its role
   (``_copy_part``), and the target returns the copy (``_whole_model``);
4. the first step's message for a head that does not fit the activations, from the
   framework's shapes (:meth:`StanzaTrainer._head_error`: ``_shape_dtype``,
   ``_is_tensor``, ``_what``, ``_takes``), and a checkpoint's agreement: every rank
   checks its own state, then the first error in rank order is raised everywhere, before
   anything is loaded (:meth:`StanzaTrainer._agree_on_state`).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

import numpy as np
from mpi4py import MPI

from hvdx.strategies.stanza.core_checks import Samples, check_settings, head_error, split_batch
from hvdx.strategies.stanza.core_roles import AUTO, CONV, FC
from hvdx.strategies.stanza.mpi_exchange import StanzaExchange, StanzaStats, role_communicators
from hvdx.strategies.stanza.mpi_setup import agree_on_arguments, probe_roles
from hvdx.strategies.stanza.mpi_step import StanzaStep

__all__ = ["StanzaTrainer"]


class StanzaTrainer:
    """What both Stanza trainers do (module docstring); a subclass supplies the hooks.

    Attributes (set by :meth:`_start`):
        role, roles, rank, stats, probe, micro_batches: as documented by the
            subclasses.
        steps: steps taken (restored from a checkpoint).
    """

    #: Where a user finds an example batch, for ``fc_workers="auto"``'s message.
    _source = "loader"
    #: Whether the ranks agree at construction that ``head(features(example))`` runs.
    _fit_on_example = False

    # --- construction -----------------------------------------------------------------

    def _start(self, comm: MPI.Comm, features, head, split, fc_workers: Union[int, str],
               micro_batches, example) -> None:
        """Step 1 of the module docstring (collective)."""
        size, rank = comm.Get_size(), comm.Get_rank()
        self.rank = rank
        error: Optional[Exception] = None
        roles, parts = None, None
        auto = isinstance(fc_workers, str) and fc_workers == AUTO
        try:
            # In the order of the arguments: the model, then fc_workers.
            parts = self._take_parts(features, head, split, example)
            roles = check_settings(size, fc_workers, micro_batches, self._is_batch(example),
                                   self._what(example), self._source)
        except (TypeError, ValueError) as exc:
            error = exc
        entries = list(self._entries(*parts)) if error is None else []
        agree_on_arguments(comm, [e[:3] for e in entries],
                           [("fc_workers", fc_workers), ("split", split),
                            ("micro_batches", micro_batches)], error,
                           labels=[e[3] for e in entries if len(e) > 3])
        self._parts = {CONV: parts[0], FC: parts[1]}
        #: fc_workers="auto": the agreed probe ``{"conv_s", "head_s", "fc_workers"}``.
        self.probe: Optional[Dict[str, object]] = None
        if self._fit_on_example and example is not None:
            found = comm.allgather(self._fit_error(example))
            found = next((e for e in found if e is not None), None)
            if found is not None:
                raise ValueError(found)
        if auto:
            roles, self.probe = probe_roles(comm, self._samples_of(example),
                                            self._what(example),
                                            lambda: self._probe(example))
        self.micro_batches = int(micro_batches)
        self.roles = roles
        self.role = roles.role(rank)
        self.stats = StanzaStats()
        self.steps = 0
        world, role_comm = role_communicators(comm, roles)
        self._exchange = StanzaExchange(world, role_comm, roles, self.stats)
        self._protocol = StanzaStep(self._exchange, rank, micro_batches)
        self._adapter = self._new_adapter()
        self._broadcast_initial()

    def _broadcast_initial(self) -> None:
        """The conv workers take rank 0's features, the FC workers rank 0's head."""
        parts = self._parts
        self._exchange.share_initial(lambda role: self._part_bytes(parts[role]),
                                     lambda role: self._part_size(parts[role]),
                                     lambda role, buffer: self._load_part(parts[role], buffer))

    @property
    def _mine(self):
        """This rank's role's part."""
        return self._parts[self.role]

    @property
    def _samples(self) -> Optional[Samples]:
        """The per-sample shapes and dtypes the first step agreed on (``None``: none yet)."""
        return self._protocol.samples

    # --- training ---------------------------------------------------------------------

    def step(self, x=None, y=None) -> float:
        """One training step (step 2 of the module docstring); collective."""
        self.stats.begin_step()
        self._zero_gradients()
        if self.role == CONV:
            loss = self._protocol.conv(split_batch(x, y, self.micro_batches, self._lengths),
                                       self._adapter, self._step_extra(x))
        else:
            loss = self._protocol.fc(self._adapter)
        self._apply_gradients()
        self.steps += 1
        self.stats.end_step()
        return loss

    # --- the whole model, checkpoints ---------------------------------------------------

    def full_model(self, rank: int = 0):
        """The complete trained model on ``rank``, ``None`` elsewhere (step 3 of the
        module docstring; collective)."""
        integer = isinstance(rank, (int, np.integer)) and not isinstance(rank, bool)
        shell, copy_error = None, None
        if integer and int(rank) == self.rank:
            try:
                shell = self._model_shell()
            except Exception as exc:  # whatever the framework raises on a model it cannot copy
                copy_error = (f"Stanza.full_model: rank {self.rank} cannot copy the model: "
                              f"{type(exc).__name__}: {exc}")
        target = self._exchange.agree_on_target(rank, copy_error)

        def part(role):
            mine = self._parts[role]
            return (role, lambda: self._copy_part(shell, role, None),
                    lambda: self._part_bytes(mine), lambda: self._part_size(mine),
                    lambda buffer: self._copy_part(shell, role, buffer))

        self._exchange.assemble(target, [part(CONV), part(FC)])
        return self._whole_model(shell) if self.rank == target else None

    def _layout_of_rank(self) -> Dict[str, object]:
        """What a checkpoint of this rank records, and what it must match to load."""
        return dict(self.roles.layout(), rank=self.rank, role=self.role)

    def _agree_on_state(self, error: Optional[str]) -> None:
        """Every rank's verdict on its own state (``None``: it fits); the first error in
        rank order raised on every rank (collective)."""
        error = self._exchange.first_error(error)
        if error is not None:
            raise ValueError(error)

    def _head_error(self, inputs, targets, outputs, exc: Exception) -> str:
        """The message for a head (or loss) that cannot take the activations
        (:func:`hvdx.strategies.stanza.core_checks.head_error`); ``targets=None``: on
        ``example=``."""
        if outputs is not None:
            outputs = tuple(outputs.shape) if self._is_tensor(outputs) else self._what(outputs)
        labels = None if targets is None else self._shape_dtype(targets)
        return head_error(self.rank, exc, self._shape_dtype(inputs), labels, outputs,
                          self._takes(self._parts[FC]))

    # --- the framework's hooks ----------------------------------------------------------

    def _take_parts(self, features, head, split, example) -> Tuple[object, object]:
        """``(features, head)`` as the subclass trains them; raises ``TypeError`` or
        ``ValueError`` for bad arguments (this rank only: step 1 agrees on it)."""
        raise NotImplementedError

    def _entries(self, features, head) -> List[tuple]:
        """Fingerprint entries ``(key, dtype, shape[, label])`` of both parts."""
        raise NotImplementedError

    def _fit_error(self, example) -> Optional[str]:
        """Why ``head(features(example))`` fails on this rank, or ``None``."""
        return None

    def _probe(self, example):
        """``(conv, fc)`` for :func:`hvdx.strategies.stanza.mpi_setup.probe_roles`."""
        raise NotImplementedError

    def _new_adapter(self):
        """The framework's part of a step, for :class:`~hvdx.strategies.stanza.mpi_step.StanzaStep`."""
        raise NotImplementedError

    def _part_bytes(self, part) -> np.ndarray:
        """A part's parameters and buffers as host bytes."""
        raise NotImplementedError

    def _part_size(self, part) -> int:
        raise NotImplementedError

    def _load_part(self, part, buffer: np.ndarray) -> None:
        """Inverse of :meth:`_part_bytes`, into the part's own tensors."""
        raise NotImplementedError

    def _zero_gradients(self) -> None:
        """Before a step: the optimizer's gradients cleared, where it holds them."""

    def _apply_gradients(self) -> None:
        """After the role's sum: the optimizer's step."""
        raise NotImplementedError

    def _lengths(self, x, y):
        """For :func:`~hvdx.strategies.stanza.core_checks.split_batch`."""
        raise NotImplementedError

    def _step_extra(self, x):
        """What the conv worker passes with its samples to the first step's agreement."""
        return None

    def _samples_of(self, example) -> int:
        return int(example.shape[0])

    def _model_shell(self):
        """On the target of :meth:`full_model`: what :meth:`_copy_part` fills."""
        raise NotImplementedError

    def _copy_part(self, shell, role: str, buffer: Optional[np.ndarray]) -> None:
        """``role``'s part into ``shell``: this rank's own (``buffer=None``) or the bytes
        received."""
        raise NotImplementedError

    def _whole_model(self, shell):
        raise NotImplementedError

    @staticmethod
    def _is_batch(example) -> bool:
        raise NotImplementedError

    @staticmethod
    def _is_tensor(value) -> bool:
        raise NotImplementedError

    @staticmethod
    def _what(value) -> str:
        """A value in words, for messages."""
        raise NotImplementedError

    @staticmethod
    def _shape_dtype(tensor) -> Tuple[object, object]:
        """``(shape, dtype)`` as the framework names them, for messages."""
        raise NotImplementedError

    @staticmethod
    def _takes(head) -> str:
        """What the head's first layer takes, in words, or ``""``."""
        return ""
