"""Symbolic cost model: SymPy expressions for compute, communication and memory of one iteration.

- `symbols`     the fixed vocabulary (n, g, b, B, ...) with meaning and unit
- `roofline`    per-layer forward/backward time, max(FLOPs / (eta P), bytes / (eta_mem beta_mem))
- `collectives` alpha-beta costs of allreduce variants, reduce-scatter, all-gather
- `memory`      bytes per device: weights, gradients, optimizer state, activations
- `data_parallel` the above combined for data-parallel training, with overlap and buckets
- `piecewise`   the convex piecewise-affine structure of roofline sums, used by `limits`
"""
