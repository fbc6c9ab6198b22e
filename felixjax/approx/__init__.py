"""Approximation knobs in the same objective as the schedules (issue 17).

Modules: ``executor`` (the fused graph in JAX, twin of the numpy executor), ``knobs`` (channel groups,
pruning), ``quality`` (soft masks, fake quantization, magnitude masks, metrics), ``objective`` (latency
tables from the cost model, the joint descent, fine-tuning), ``search`` (``fj.approximate``), ``digits``
(the offline data set and CNN of the benchmark and notebook 05), ``cli`` (``felixjax approx``).
"""
