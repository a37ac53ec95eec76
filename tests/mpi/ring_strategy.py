"""The complete example strategy of docs/design.md ("One protocol for every mixing
strategy"), as written there (tests/unit/test_design_example.py holds the two equal):
a spec and its mixer, and its catalogue entry. The tests that run it stand its module in
for ``hvdx.strategies.ring.spec``, the folder a built-in would have."""

# hvdx/strategies/ring/spec.py
from hvdx.core.mixing_graphs import Neighbors
from hvdx.core.mixer_protocol import Everyone, Mixer, Neighbours
from hvdx.strategy_contract import Job, MixingStrategy, validating


class Ring(MixingStrategy):
    name, state_key = "ring", "hvdx_ring"

    @validating
    def __init__(self, global_every=0):
        self._init_mixing(global_every=global_every)

    def prepare(self, job: Job):
        self.check_gradient_arguments(job, "the ring")
        return (job.rank, job.size)

    def fingerprint_settings(self, job, setup):
        return [("ring.size", job.size), ("ring.global_every", self.global_every)]

    def make_mixer(self, setup):
        return RingMixer(*setup)


class RingMixer(Mixer):
    state_entry = None

    def __init__(self, rank, size):
        left, right = (rank - 1) % size, (rank + 1) % size
        peers = tuple(sorted({left, right} - {rank}))
        self.neighbours = Neighbors(peers, peers, 1 / (len(peers) + 1),
                                    (1 / (len(peers) + 1),) * len(peers))

    def exchange(self, step, everyone):
        return Everyone() if everyone else Neighbours(self.neighbours)


# hvdx/strategies/ring/descriptor.py
from hvdx.strategies.descriptor import Constructor, StrategyDescriptor

RING = StrategyDescriptor(name="ring", kind="sync", title="ring gossip",
                          constructors=(Constructor("Ring", "hvdx.strategies.ring.spec:Ring"),))
