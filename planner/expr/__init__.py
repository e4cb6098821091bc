"""The cost model as expressions, the one source of truth that evaluate, solve, sweep, limits
and derive read: the symbols and their glossary (`symbols`), the roofline (`roofline`), the
collectives (`collectives`), memory (`memory`), a CNN's data-parallel iteration (`cnn`, in
SymPy) and a transformer's hybrid-parallel iteration (`transformer` and `layer`, written in the
SymPy-free algebra of `graph` over the symbols of `vocab`, so a cold search loads no SymPy;
`graph.to_sympy` gives `limits` and `derive` the same expressions in SymPy). `planner.numeric`
and `graph.compile_graphs` compile them to numpy; `planner.cost` holds the evaluated arrays the
searches price."""
