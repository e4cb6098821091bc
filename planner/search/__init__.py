"""CP-SAT search over the discrete choices (`compiler`: SymPy -> CP-SAT; `data_parallel`: the model)."""
