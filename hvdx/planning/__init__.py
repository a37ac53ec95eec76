"""The parts of ``hvdx plan`` (:mod:`hvdx.plan`, the command): its flags read into a
cluster, a workload and strategy options (:mod:`~hvdx.planning.flags`), the figures
priced from them (:mod:`~hvdx.planning.figures`), each strategy's ``to run`` line
(:mod:`~hvdx.planning.run_lines`) and the text (:mod:`~hvdx.planning.text`).
"""
