"""The cost model as SymPy expressions, the one source of truth that evaluate, solve, sweep,
limits and derive read: the symbols and their glossary (`symbols`), the roofline (`roofline`),
the collectives (`collectives`), memory (`memory`), a CNN's data-parallel iteration (`cnn`) and
a transformer's hybrid-parallel iteration (`transformer`). `planner.numeric` compiles them to
numpy; `planner.cost` holds the evaluated arrays the searches price."""
