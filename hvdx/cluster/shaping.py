"""How one direction of an emulated link is shaped: tc's token bucket (``tbf``) at the
link's rate on the egress of its interface, under ``netem`` where the link has a
latency (:class:`Link`).
"""

from __future__ import annotations

from typing import List, Optional

from hvdx.cluster.iproute import run

__all__ = ["Link"]

# tbf's queue, as the time a full queue takes to drain: enough for TCP to keep a
# near-zero-RTT link busy, small enough not to bloat round trips beyond a few ms.
_TBF_QUEUE = "20ms"


def _tbf_args(rate: int) -> List[str]:
    # The bucket holds 4 ms of traffic (at least two full frames). Too small a bucket
    # loses tokens whenever the dequeue timer runs late: on a 2-core machine a 0.1 ms
    # bucket at 1gbit carried only 675 Mbit/s, while 1 ms and 4 ms gave the full rate.
    burst = max(rate // 8 * 4 // 1000, 3200)
    return ["tbf", "rate", f"{rate}bit", "burst", str(burst), "latency", _TBF_QUEUE]


class Link:
    """One direction of a link: the egress qdisc of ``dev`` inside ``netns``."""

    def __init__(self, netns: str, dev: str, delay: Optional[float]):
        self.netns, self.dev, self.delay = netns, dev, delay

    def tc(self, *args: str) -> List[str]:
        return ["tc", "-n", self.netns, "qdisc", *args, "dev", self.dev]

    def shape(self, rate: int) -> None:
        if self.delay:
            # netem at the root, tbf below it: the bottleneck queue is then tbf's
            # (bounded in time), while netem only holds packets still "on the wire".
            limit = max(1000, int(2 * rate * self.delay / (8 * 1500)))
            run(self.tc("add") + ["root", "handle", "1:", "netem", "delay",
                                  f"{self.delay * 1e6:.0f}us", "limit", str(limit)])
            run(self.tc("add") + ["parent", "1:1", "handle", "10:"] + _tbf_args(rate))
        else:
            run(self.tc("add") + ["root", "handle", "10:"] + _tbf_args(rate))

    def set_rate(self, rate: int) -> None:
        where = ["parent", "1:1"] if self.delay else ["root"]
        run(self.tc("change") + where + ["handle", "10:"] + _tbf_args(rate))


