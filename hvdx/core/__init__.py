"""Framework-neutral algorithms of hvdx: numpy and the standard library only.

Nothing under ``hvdx.core`` imports torch, tensorflow, mpi4py or horovod (a unit test
checks it), so every algorithm here can be tested in one process without MPI, and both
framework adapters share the same code.
"""
