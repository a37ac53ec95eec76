"""hvdx's strategies, described once: :mod:`hvdx.strategies.catalogue` lists them
(:class:`~hvdx.strategies.descriptor.StrategyDescriptor`), and the framework registries
and the environment parser read them from there. Importing it imports no framework."""
