"""Approximation knobs in the same objective as the schedules (issue 17).

Modules: ``executor`` (the fused graph in JAX, twin of the numpy executor), ``knobs`` (channel groups,
pruning), ``quality`` (soft masks, fake quantization, magnitude masks, metrics), ``formats`` (a layer's
format: precision and unstructured sparsity, their tasks and arithmetic), ``precision`` (formats as a
knob: measured latency ratios, the greedy pass, the build of a chosen point), ``objective`` (latency
tables from the cost model, the joint descent over channels and format shares, fine-tuning),
``search`` (``fj.approximate``), ``result`` (its records: points, the result and its held-out check),
``digits`` (the offline data set and CNN of the benchmark and notebook 05), ``cli`` (``felixjax approx``).
"""
