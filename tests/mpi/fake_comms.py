"""Stand-ins for an mpi4py communicator, shared by the torch and TensorFlow tests."""


class NoCollectives:
    """A communicator that fails any use: where it is set, hvdx must run no collective
    of its own."""

    def __getattr__(self, name):
        raise AssertionError(f"hvdx called {name} on its communicator")
