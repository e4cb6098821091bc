"""Synchronous against asynchronous parameter servers for the seed paper's AlexNet case.

AlexNet on the seed's K80 + FDR InfiniBand system at global batch 1024 (Keuper & Pfreundt
2016), over node counts and server counts: the synchronous server without overlap (the seed's
model), with the gradient push overlapping the backward, and the n-softsync protocol of Zhang,
Gupta et al. 2016 at n = 1 and n = learners (fully asynchronous). Time to train takes the same
steps for all (the staleness-aware learning rate keeps the samples to a target those of a
synchronous run of the same global batch: Zhang et al. 2016, sec. 4.3), McCandlish et al.
2018's S(B) at B_noise 4096 and E_min 1.2e8 samples (the values of the ResNet-50 example in
docs/time-to-train.md), so it scales with the round.

    python benchmarks/async_ps.py
"""

from __future__ import annotations

from planner import api

MODEL, SYSTEM, BATCH = "alexnet", "k80-fdr", 1024
TRAIN = dict(critical_batch=4096, target_samples=1.2e8)


def _solve(nodes: int, servers: int, **kw):
    sol = api.solve(MODEL, SYSTEM, global_batch=BATCH, nodes=nodes, devices_per_node=2,
                    collective="parameter-server", servers=servers, **TRAIN, **kw)
    return sol.prediction, sol.training


def main() -> None:
    print(f"{MODEL} on {SYSTEM}, global batch {BATCH}, parameter server; time to train at "
          f"B_noise {TRAIN['critical_batch']}, E_min {TRAIN['target_samples']:.2g} samples")
    print(f"{'servers':>7} {'nodes':>5} {'sync':>9} {'sync+ov':>9} {'1-soft':>9} "
          f"{'N-soft':>9} {'bottleneck (1-soft)':>20} {'steps':>7} {'hours sync':>10} "
          f"{'hours 1-soft':>12}")
    for servers in (1, 4):
        for nodes in (1, 2, 4, 8, 16, 32):
            sync, train = _solve(nodes, servers, overlap=False)
            ov, _ = _solve(nodes, servers, overlap=True)
            one, train1 = _solve(nodes, servers, softsync=1)
            full, _ = _solve(nodes, servers, softsync=2 * nodes)
            print(f"{servers:>7} {nodes:>5} {sync.iteration_time_s:>8.3f}s "
                  f"{ov.iteration_time_s:>8.3f}s {one.iteration_time_s:>8.3f}s "
                  f"{full.iteration_time_s:>8.3f}s {one.asynchrony['bottleneck']:>20} "
                  f"{train['steps']:>7.0f} {train['time_to_train_s'] / 3600:>10.2f} "
                  f"{train1['time_to_train_s'] / 3600:>12.2f}")


if __name__ == "__main__":
    main()
