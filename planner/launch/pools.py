"""Launch forms of the best plan over a cluster of several pools (`planner solve -H CLUSTER
--format F`).

- The best plan on one pool alone is an ordinary plan on that pool's system: every form, as
  for `-H SYSTEM`.
- A pipeline across pools: Megatron-LM expresses it (one chunk per stage with its own layer
  count, `--pipeline-model-parallel-layout`, Megatron-LM MEGATRON_COMMIT; stage j on the
  global ranks of pipeline rank j, so fixed node ranks in stage order put every stage on its
  pool), and `slurm` writes the heterogeneous sbatch job that starts it, one component per
  pool in stage order, each node given its rank. torchtitan expresses it too, each stage's
  modules listed (`module_fqns_per_model_part`, torchtitan TORCHTITAN_COMMIT) and torchrun
  started with fixed node ranks. DeepSpeed's pipeline partitions layers by its own method, and
  the shell forms start one rendezvous: both refused.
- Replicas across pools: refused by every form. Megatron-LM, torchtitan and DeepSpeed give
  every data-parallel replica the same micro-batches per step; the plan gives each pool its
  own.
"""

from __future__ import annotations

from planner import rules, switches
from planner.errors import SpecError
from planner.launch.common import Target, job_name, max_connections, normalise, summary
from planner.launch.megatron_lm import MEGATRON_COMMIT, megatron
from planner.launch.shell import (
    RDZV_PORT,
    SLURM_CPUS_PER_DEVICE,
    SLURM_DEFAULT_TIME,
)
from planner.launch.torchtitan_config import torchtitan

PIPELINE_FORMS = rules.MIXED_FORMS["pipeline across pools"]


def cluster_launch(fmt: str, sol, cluster, target: Target, model: str) -> str:
    """The `fmt` form of `sol.best` (a `planner.search.pools.ClusterSolution`)."""
    from planner.launch import render_launch
    from planner.report import render, solution_doc

    best = sol.best
    if best.kind == "one pool":
        pool = cluster.pool(best.pools[0])
        body = {"model": model, "hardware": f"{pool.system.name} ({pool.name} of "
                f"{cluster.name})", "precision": target.precision,
                **solution_doc(best.solution)}
        return render_launch(fmt, render.document("solve", body), target)
    if best.kind != "pipeline across pools":
        shares = ", ".join(f"{g.micro_batches} on {cluster.pools[g.stages[0].pool].name}"
                           for g in best.plan.groups)
        raise SpecError(f"format: --format {fmt} cannot express replicas across pools: "
                        f"Megatron-LM, torchtitan and DeepSpeed give every data-parallel "
                        f"replica the same micro-batches per step, this plan runs {shares} "
                        f"(--format json has it)")
    if fmt not in PIPELINE_FORMS:
        raise SpecError(f"format: --format {fmt} cannot express a pipeline across pools (stages "
                        f"of unequal layer counts on different nodes); use --format megatron or "
                        f"torchtitan (and slurm to start it), or json")
    plan, doc = pipeline_plan(sol, cluster), {
        "model": model, "hardware": cluster.name, "status": sol.status,
        "prediction": {"iteration_time_s": best.iteration_time_s}}
    if fmt == "torchtitan":
        return torchtitan(doc, plan, target)
    return megatron(doc, plan, target) if fmt == "megatron" else het_slurm(doc, plan, target)


def pipeline_plan(sol, cluster) -> dict:
    """The launcher-facing fields of a pipeline across pools (`normalise`'s), with
    `stage_layers` (per stage) and `pool_nodes` ([(pool, nodes, stages), ...] in stage order,
    and the pool's Slurm partition in `pool_partitions`)."""
    best = sol.best
    mixed = best.plan
    (group,) = mixed.groups
    shape, stages = mixed.shape, group.stages
    per_node = {cluster.pools[s.pool].system.devices_per_node for s in stages}
    if len(per_node) > 1:
        raise SpecError("format: the pools of this pipeline have different devices per node "
                        f"({sorted(per_node)}); the launcher starts the same number of ranks "
                        "on every node (--format json has the plan)")
    g = per_node.pop()
    runs, partitions, order = [], [], []
    for k in dict.fromkeys(s.pool for s in stages):
        mine = [j for j, s in enumerate(stages) if s.pool == k]
        order += mine
        nodes = len(mine) * group.replicas * shape.width // g
        layers = sorted({stages[j].layers for j in mine})
        which = (f"stages {mine[0]}-{mine[-1]}" if mine[-1] != mine[0]
                 else f"stage {mine[0]}")
        runs.append((cluster.pools[k].name, nodes,
                     f"{which}, {'/'.join(map(str, layers))} layers each"))
        partitions.append(cluster.pools[k].partition)
    if order != list(range(len(stages))):  # the search places each pool's stages in one run
        raise SpecError("format: a pool's stages are not one run of the pipeline")
    devices = sum(n for _, n, _ in runs) * g
    given = dict(shape.switches)
    config = {"devices": devices, "devices_per_node": g, "nodes": devices // g,
              "tp": shape.tp, "cp": shape.cp, "pp": len(stages), "dp": group.replicas,
              "micro_batch": shape.micro_batch, "global_batch": mixed.global_batch,
              "gradient_accumulation": group.micro_batches, "interleave": 1,
              "recompute": shape.recompute, "sequence_parallel": shape.sequence_parallel,
              "zero": shape.zero, "overlap": shape.overlap,
              **{s.name: s.json(given[s.name]) for s in switches.SWITCHES if s.name in given}}
    return {**normalise(config), "stage_layers": [s.layers for s in stages],
            "pool_nodes": runs, "pool_partitions": partitions}


def het_slurm(doc: dict, plan: dict, target: Target) -> str:
    """A heterogeneous sbatch job (Slurm's `#SBATCH hetjob`): one component per pool in stage
    order, each one task per node; the step spans them all (`srun --het-group`), and every
    node takes its rank from its place in the components' host lists, which is what the
    megatron form's fixed node ranks read (NODE_RANK)."""
    g, runs = plan["devices_per_node"], plan["pool_nodes"]
    lines = ["#!/bin/bash", f"#SBATCH --job-name=planner-{job_name(doc)}",
             f"#SBATCH --time={SLURM_DEFAULT_TIME}"]
    for i, ((pool, nodes, stages), part) in enumerate(zip(runs, plan["pool_partitions"],
                                                           strict=True)):
        if i:
            lines.append("#SBATCH hetjob")
        lines += [f"#SBATCH --nodes={nodes} --ntasks-per-node=1 --gpus-per-node={g} "
                  f"--cpus-per-task={SLURM_CPUS_PER_DEVICE * g}",
                  f"#SBATCH --partition={part or 'PLACEHOLDER-' + pool}"]
        lines.append(f"# component {i}: {pool}, {stages}" + (
            "" if part else f"; PLACEHOLDER partition: set `partition:` on pool {pool} in the "
            "cluster YAML (sbatch stops on an unknown one)"))
    groups = f"0-{len(runs) - 1}"
    lines += [
        *(f"# {line}" for line in summary(doc, plan)),
        f"# precision {target.precision}",
        f"# --time: a default ({SLURM_DEFAULT_TIME}); the planner prices throughput across "
        "pools, not a training run",
        "# usage: TRAIN_SCRIPT=megatron.sh sbatch job.sh  (planner --format megatron for the "
        "same plan;",
        f"#   it starts torchrun with the node rank this job gives; Megatron-LM "
        f"{MEGATRON_COMMIT[:12]})",
        "set -euo pipefail",
        ': "${TRAIN_SCRIPT:?set TRAIN_SCRIPT to the megatron form of this plan}"',
        *max_connections(plan),
        "# every component's hosts in stage order: a node's place in it is its node rank",
        "hosts=()",
        f"for i in $(seq 0 {len(runs) - 1}); do",
        '  list="SLURM_JOB_NODELIST_HET_GROUP_$i"',
        '  while read -r h; do hosts+=("$h"); done < <(scontrol show hostnames "${!list}")',
        "done",
        'export PLANNER_HOSTS="${hosts[*]}"',
        f'export MASTER_ADDR="${{hosts[0]}}" MASTER_PORT={RDZV_PORT}',
        f"srun --het-group={groups} bash -c '",
        "  r=0",
        '  for h in $PLANNER_HOSTS; do',
        '    if [ "$h" = "$SLURMD_NODENAME" ]; then export NODE_RANK=$r; '
        'exec bash "$TRAIN_SCRIPT" "$@"; fi',
        "    r=$((r + 1))",
        "  done",
        '  echo "node $SLURMD_NODENAME is not in the host list of this job" >&2; exit 1',
        "' planner \"$@\""]
    return "\n".join(lines)

