"""The benchmark every hvdx strategy is judged by: ``hvdx bench``.

One training workload runs under each strategy, Horovod's ring allreduce first, on the
same (emulated) cluster in the same run; speedups are ratios against that baseline.
"""
