"""The cluster's link rates, ``(nic, uplink)`` in bits/s, as the user or the environment
gives them.

DS-Sync's rotation chooses its phases from them (:meth:`hvdx.DSSync.rotation_parameters`);
the spec (:mod:`hvdx.strategies.dssync.spec`) and the static process sets
(:mod:`hvdx.strategies.dssync.mpi_groups`) read the environment alike:

1. ``DSSync(link_rates=...)`` is parsed by :func:`parse_link_rates` (a pair, or
   ``"nic,uplink"``, each a number or a tc rate);
2. otherwise :func:`link_rates_from_environment` reads the first variable of
   :data:`LINK_RATES_VARIABLES` that is set.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

from hvdx.core.units import parse_rate

__all__ = ["LINK_RATES_VARIABLES", "link_rates_from_environment", "parse_link_rates"]

#: ``"nic,uplink"`` link rates of the job's cluster (see ``DSSync(link_rates=...)``), in
#: order of precedence: the user's, then the emulated cluster's (:mod:`hvdx.cluster`).
LINK_RATES_VARIABLES = ("HVDX_LINK_RATES", "HVDX_CLUSTER_LINK_RATES")


def parse_link_rates(value, name: str = "link_rates") -> Tuple[int, int]:
    """``(nic, uplink)`` in bits/s from a pair or a ``"nic,uplink"`` string.

    Raises:
        ValueError: naming ``name`` and the value.
    """
    pair = value.split(",") if isinstance(value, str) else value
    try:
        nic, uplink = pair
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be a pair (nic, uplink) of rates, e.g. "
                         "('25gbit', '100gbit')") from None
    return (int(parse_rate(nic.strip() if isinstance(nic, str) else nic, f"{name}[0] (nic)")),
            int(parse_rate(uplink.strip() if isinstance(uplink, str) else uplink,
                           f"{name}[1] (uplink)")))


def link_rates_from_environment() -> Optional[Tuple[int, int]]:
    """The first of :data:`LINK_RATES_VARIABLES` that is set, parsed; else ``None``.

    Per rank: ranks that read different rates build different rotations, which the
    fingerprint (``dssync.link_rates``) turns into the same error on every rank.
    """
    for variable in LINK_RATES_VARIABLES:
        raw = os.environ.get(variable, "").strip()
        if raw:
            return parse_link_rates(raw, variable)
    return None
