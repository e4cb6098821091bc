"""The cost model evaluated: what the searches price, built from the expressions of
`planner.expr`.

- `transformer` the transformer expressions compiled once per (model, hardware, choices) and run
                on arrays of plans (`iteration`), with the hardware rates they need
- `cnn_layout`, `layer_modes`, `stages` a CNN's per-layer data / model modes and pipeline
                stages as arrays over layer groups and units (the layer-split searches)
"""
