"""planner: symbolic/constraint planning for distributed deep-learning training.

    import planner
    sol = planner.solve("alexnet", "k80-fdr", global_batch=256)
    sol = planner.solve("gpt3-175b", "dgx-a100-80gb", global_batch=1536, devices_max=4096)
    lim = planner.limits("gpt3-175b", "dgx-a100-80gb", global_batch=1536).summary()

Each verb dispatches on the model's family (CNN or transformer); `evaluate_transformer`,
`solve_transformer` and `sweep_transformer` are the former names, kept as aliases.

The operations live in `planner.api`; they are loaded on first use so that `import planner`
stays cheap (SymPy and OR-Tools load only when a command needs them).
"""

API = ("evaluate", "solve", "limits", "derive", "derivation", "sweep",
       "evaluate_transformer", "solve_transformer", "sweep_transformer", "load_model",
       "load_system", "is_transformer")

__all__ = list(API)


def __getattr__(name: str):
    if name in API:
        from planner import api

        return getattr(api, name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
