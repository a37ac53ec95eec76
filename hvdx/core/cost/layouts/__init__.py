"""Every strategy's traffic per step, as a plan of phases (one module per strategy).

A layout is ``layout(cluster, workload, **options) -> _Plan``; its options are the
parameters after the first two (:func:`hvdx.core.cost.predict.predict` checks them).
"""

from hvdx.core.cost.layouts.decentralized import _decentralized
from hvdx.core.cost.layouts.dssync import _dssync
from hvdx.core.cost.layouts.horovod import _hierarchical, _horovod
from hvdx.core.cost.layouts.stanza import _stanza
from hvdx.core.cost.layouts.topk import _topk

#: Strategy keys and the function that lays out their traffic.
STRATEGIES = {"horovod": _horovod, "hierarchical": _hierarchical, "topk": _topk,
              "dssync": _dssync, "decentralized": _decentralized, "stanza": _stanza}
