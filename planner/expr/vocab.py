"""The symbols of `planner.expr.symbols` that the transformer cost model is written in, as
`planner.expr.graph` symbols: each the same identifier and SymPy name as there (the glossary,
the assumptions and every other family stay with those), so `graph.to_sympy` turns them back
into the very same SymPy symbols. Importing this loads no SymPy."""

from __future__ import annotations

from planner.expr.graph import symbol

# the plan's integers (Narayanan et al. SC21 notation)
t, p, d, b, m, v = (symbol(x) for x in ("t", "p", "d", "b", "m", "v"))
c_p, e_p, e_t, n_r, d_s = (symbol(x) for x in ("c_p", "e_p", "e_t", "n_r", "d_s"))
# the aggregates the iteration's time and memory forms are written in
tau, tau_p2p, r, H, ell = (symbol(x) for x in ("tau", "tau_p2p", "r", "H", "ell"))
T_opt, Psi, Psi_t, delta = (symbol(x) for x in ("T_opt", "Psi", "Psi_t", "delta"))
T_sync, W_q = symbol("T_sync"), symbol("W_q")
gamma_g, kappa, A_act, z, sigma, M = (symbol(x) for x in ("gamma_g", "kappa", "A_act", "z",
                                                             "sigma", "M"))
M_e, d_e, r_e = (symbol(x) for x in ("M_e", "d_e", "r_e"))
alpha, beta = symbol("alpha_inter"), symbol("beta_inter")
alpha_i, beta_i = symbol("alpha_intra"), symbol("beta_intra")
