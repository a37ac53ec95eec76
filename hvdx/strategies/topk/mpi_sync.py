"""TopK's step over mpi4py, by the names this module held before the step was split
into GRACE's parts (Xu et al., ICDCS 2021): :mod:`hvdx.strategies.topk.mpi_driver` says
which module is which part.
"""

from hvdx.strategies.topk.core_checkpoint import check_saved_rank
from hvdx.strategies.topk.core_counters import TopKStats
from hvdx.strategies.topk.mpi_driver import TopKSynchronizer
from hvdx.strategies.topk.mpi_nonfinite import JOINED, first_nonfinite

__all__ = ["JOINED", "TopKStats", "TopKSynchronizer", "check_saved_rank", "first_nonfinite"]
