"""The searches: `table` (a priced table of plans, CP-SAT over its row index, shared by the
data-parallel and the transformer searches), `data_parallel` and `hybrid` (what they price),
`layer_modes`, `stages` and `strategy` (real CP-SAT models for CNN layer splits, under a branch
and bound), `objective`, `training` (time and cost to train) and `solution`."""
