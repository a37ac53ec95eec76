"""The price of one phase: the links its flows load, and the busiest one's time, from
the rates and alpha or from the cluster's calibration (:mod:`hvdx.core.cost_model`).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from hvdx.core.cost.types import Cluster, Flow, Phase, _Traffic


def _link_flows(flows: List[Flow], c: Cluster) -> Dict[str, List[Tuple[int, float, bool]]]:
    """Per link class, every loaded link in each direction as ``(flows, bytes, oneway)``,
    ``oneway`` when nothing goes through that link the other way.

    A flow loads its hosts' NICs when it leaves its host, its racks' uplinks when it leaves
    its rack, and the two ranks' intra-host ports when it stays on one host.
    """
    sizes = {"nic": c.racks * c.hosts_per_rack, "uplink": c.racks, "intra-host": c.ranks}
    counts = {link: np.zeros((2, size)) for link, size in sizes.items()}
    loads = {link: np.zeros((2, size)) for link, size in sizes.items()}
    host, rack = c.host_of_rank, c.rack_of_rank
    for src, dst, nbytes in flows:
        host_s, host_d = host[src], host[dst]
        rack_s, rack_d = rack[src], rack[dst]
        for link, a, b, mask in (("nic", host_s, host_d, host_s != host_d),
                                 ("uplink", rack_s, rack_d, rack_s != rack_d),
                                 ("intra-host", src, dst, (host_s == host_d) & (src != dst))):
            for side, ends in ((0, a), (1, b)):
                leaving = np.bincount(ends[mask], minlength=sizes[link])
                counts[link][side] += leaving
                loads[link][side] += leaving * nbytes
    # Row 0 of a link is its traffic out, row 1 its traffic in: the other way is row 1 - side.
    return {link: [(int(counts[link][side, i]), float(loads[link][side, i]),
                    not counts[link][1 - side, i])
                   for side in (0, 1) for i in range(sizes[link]) if counts[link][side, i]]
            for link in sizes}


def _link_loads(flows: List[Flow], c: Cluster) -> Dict[str, float]:
    """Bytes through the busiest NIC, uplink and intra-host port, in its busier direction
    (:func:`_link_flows`)."""
    return {link: max((nbytes for _, nbytes, _ in loaded), default=0.0)
            for link, loaded in _link_flows(flows, c).items()}


def _price_calibrated(traffic: _Traffic, c: Cluster) -> Tuple[float, str]:
    """Seconds of one occurrence of ``traffic`` from the cluster's calibration, and the
    link class that took longest.

    1. per link and direction, the flows through it and their bytes;
    2. a repeated traffic (a ring) is ``rounds`` rounds of ``1/rounds`` of those bytes,
       each priced by :meth:`Calibration.round_s` for that many flows: from the timed
       one-way rounds on a link that nothing crosses the other way, from the timed
       swaps if every flow is answered by one the other way (unless hvdx's own
       exchange, which posts sends first, sends them), else from the timed shifts; a
       traffic sent all at once is one round;
    3. the busiest link sets the time; a class the calibration lacks is priced by the
       rates and alpha (``intra-host`` without a rate: free).
    """
    cal = c.calibration
    rates = {"nic": c.nic_bps, "uplink": c.uplink_bps, "intra-host": c.intra_host_bps}
    best, where = 0.0, "none"
    rounds = traffic.rounds if traffic.repeated else 1
    # Ranks that swap messages in pairs, or a shift (sent to one rank, received from
    # another): the calibration timed both (hvdx.core.calibration, step 4).
    edges = {(int(a), int(b)) for src, dst, _ in traffic.flows for a, b in zip(src, dst)}
    shift = traffic.sends_first or any((b, a) not in edges for a, b in edges)
    for link, loaded in _link_flows(traffic.flows, c).items():
        for flows, nbytes, oneway in loaded:
            if cal.has(link):
                seconds = rounds * cal.round_s(link, flows, nbytes / flows / rounds, shift,
                                               oneway)
            elif rates[link]:
                seconds = traffic.rounds * c.latency_s + 8 * nbytes / rates[link]
            else:
                seconds = 0.0
            if seconds > best:
                best, where = seconds, link
    return best, where


def _price(traffic: _Traffic, c: Cluster) -> Phase:
    """1. load every link with the flows; 2. busiest link / its rate; 3. add rounds * alpha.

    With a calibration, 2 and 3 are :func:`_price_calibrated`.
    """
    loads = _link_loads(traffic.flows, c)
    sent = sum(len(src) * nbytes for src, _, nbytes in traffic.flows) / c.ranks
    if traffic.measured_s is not None:
        return Phase(traffic.name, traffic.weight, traffic.rounds, traffic.measured_s,
                     "measured", loads["nic"], loads["uplink"], loads["intra-host"], sent)
    if c.calibration is not None:
        seconds, link = _price_calibrated(traffic, c)
        return Phase(traffic.name, traffic.weight, traffic.rounds, seconds, link,
                     loads["nic"], loads["uplink"], loads["intra-host"], sent)
    rates = {"nic": c.nic_bps, "uplink": c.uplink_bps, "intra-host": c.intra_host_bps}
    times = {link: 8 * load / rates[link] if rates[link] else 0.0
             for link, load in loads.items()}
    link = max(times, key=times.get)
    latency = traffic.rounds * c.latency_s if traffic.flows else 0.0
    bottleneck = "latency" if latency > times[link] else link if times[link] > 0 else "none"
    return Phase(traffic.name, traffic.weight, traffic.rounds, latency + times[link],
                 bottleneck, loads["nic"], loads["uplink"], loads["intra-host"], sent)
