"""The space a transformer search runs over: the request (`Search`: what is pinned, bounded
or asked) and, per global batch, every structurally valid (t, p, v, d, mb, cp, ep, etp)
row and the categorical choices priced on each (`planner.search.hybrid` prices and solves)."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from planner import rules, switches
from planner.cost.transformer import PARTIAL, RECOMPUTE
from planner.errors import SpecError
from planner.plan import check_pins, hsdp_fits_experts
from planner.search import table as core
from planner.search.memory_fit import DEFAULT_MEMORY_HEADROOM
from planner.search.objective import Objective
from planner.search.training import Training
from planner.spec.transformer import Transformer


@dataclass(frozen=True)
@switches.add_fields
class Search:
    """What the user pinned or bounded; None means free. Give global_batch or
    global_batch_range (the search then picks among `candidate_batches`). Every switch of
    `planner.switches` is a field, priced as given on every row."""

    global_batch: int | None = None
    global_batch_range: tuple[int, int] | None = None
    nodes: int | None = None
    nodes_max: int | None = None
    devices: int | None = None
    devices_max: int | None = None
    tp: int | None = None
    cp: int | None = None
    cp_max: int | None = None  # the highest context-parallel degree offered (None: 16)
    ep: int | None = None
    ep_max: int | None = None  # the highest expert-parallel degree offered (None: any)
    etp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    interleave: int | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None
    zero: int | None = None
    schedule: str | None = None
    recompute_layers: int | None = None  # with full recompute: layers of each chunk (None: all)
    objective: Objective | str = Objective.throughput
    token_budget: float | None = None
    training: Training | None = None
    pareto: bool = False
    top: int = 0
    fewest_nodes_within: float | None = None  # 0.05: the fewest nodes within 5% of the best
    time_limit_s: float = 10.0
    workers: int = 1
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM  # fraction of device memory kept free
    knee_tolerance: float = core.DEFAULT_KNEE_TOLERANCE  # the knee: fewest devices within it
    # the switches of `planner.switches.SEARCHED` the request left unset: the search tries
    # each on and off per plan (a switch named here prices both, whatever its field says)
    searched: tuple[str, ...] = ()
    # the framework whose launcher form must write the plan (megatron, torchtitan,
    # deepspeed): the search keeps to the plans its `planner.rules.FORM_RULES` allow
    framework: str | None = None

    def __post_init__(self):
        switches.checked(self)


def _divisors(x: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(x) + 1) if x % d == 0]
    return sorted(set(small + [x // d for d in small]))


def candidate_batches(lo: int, hi: int) -> list[int]:
    """The global batches a batch range offers: its ends and every 2^k and 3 x 2^k between
    (1024, 1536, 2048, ...: the batches transformer runs use, a grid no coarser than 1.5x).
    Each one is searched exactly; every integer would multiply the rows by the range width."""
    out = {lo, hi}
    k = 1
    while k <= hi:
        out.update(x for x in (k, 3 * k) if lo <= x <= hi)
        k *= 2
    return sorted(out)


# the context-parallel degrees a search tries beyond 1 (bounded by `Search.cp_max`)
CP_TRIED = (2, 4, 8, 16)


def cps(m: Transformer, q: Search) -> list[int]:
    """Context-parallel degrees the search offers: the pin, or 1 and every power of two up to
    16 (up to `cp_max`) whose 2 cp load-balanced chunks divide the sequence, for sequences of
    8k tokens and more (shorter ones gain nothing from splitting)."""
    if q.cp is not None:
        return [q.cp]
    top = CP_TRIED[-1] if q.cp_max is None else q.cp_max
    return [1] + [c for c in CP_TRIED
                  if c <= top and m.seq_len >= 8192 and m.seq_len % (2 * c) == 0]


def eps(m: Transformer, q: Search) -> list[int]:
    """Expert-parallel degrees the search offers: the pin, or every power of two dividing the
    experts up to `ep_max` (1 for a dense model)."""
    if q.ep is not None:
        return [q.ep]
    return [e for e in (1, 2, 4, 8, 16, 32, 64, 128, 256)
            if m.experts % e == 0 and (q.ep_max is None or e <= q.ep_max)]


def etp_modes(m: Transformer, q: Search) -> list[int]:
    """Expert tensor parallelism the search offers, as codes: 0 for etp = tp (Megatron-LM's
    default), 1 for etp = 1 (experts whole on each rank, the usual choice for fine-grained
    experts); a pin is its value (negative codes are pins). Dense models: etp = tp."""
    if q.etp is not None:
        return [-q.etp]
    return [0, 1] if m.experts > 1 else [0]


def stage_ok(m: Transformer, q: Search, p: int, v: int) -> bool:
    """Whether p stages of v chunks can hold the layers: an even split (Megatron-LM), the
    embedding and the loss each in a layer's slot, or the pinned first / last stages and an
    even split of the rest."""
    if not (q.first_stage_layers or q.last_stage_layers):
        L = m.layers
        if v == 1 or L % (p * v) == 0:
            return True
        if v > -(-L // p):  # every chunk of the fullest stage holds a layer
            return False
        # a pinned v may leave the chunks uneven; unpinned, the search offers the layouts of
        # Megatron-LM's --account-for-embedding-in-pipeline-split and
        # --account-for-loss-in-pipeline-split: L + 2 (or L + 1, the embedding alone) slots
        # split evenly over the p v chunks, the first chunk (and the last, beside the loss)
        # one layer short, which is the layout `planner.plan.chunk_layers` gives these L
        return q.interleave == v or (L + 2) % (p * v) == 0 or (L + 1) % (p * v) == 0
    try:
        check_pins(m, pp=p, interleave=v, first=q.first_stage_layers, last=q.last_stage_layers)
    except SpecError:
        return False
    return True


def structures(m: Transformer, g: int, q: Search, B: int) -> np.ndarray:
    """(t, p, v, d, mb, cp, ep, etp) rows at global batch B that satisfy divisibility, the
    pins and the device budget, in lexicographic order of (t, p, d, cp, mb, ep, etp, v). Built
    as one numpy grid of the (t, p, v) and (d, mb) combinations and the cp, ep and etp
    degrees, then masked."""
    cap = q.devices or q.devices_max or 1 << 20
    ts = [t for t in _divisors(math.gcd(m.heads, m.kv_heads)) if q.tp in (None, t) and t <= cap]
    uneven = bool(q.first_stage_layers or q.last_stage_layers)
    tpv = []
    for t, p in itertools.product(ts, range(1, m.layers + 1)):
        if q.pp not in (None, p) or t * p > cap or (uneven and not stage_ok(m, q, p, 1)):
            continue
        vs = [1] + [v for v in range(2, -(-m.layers // p) + 1)
                    if p > 1 and stage_ok(m, q, p, v)]
        tpv += [(t, p, v) for v in vs if q.interleave in (None, v)]
    pairs = [(d, mb) for d in _divisors(B) if q.dp in (None, d)
             for mb in _divisors(B // d) if q.micro_batch in (None, mb)]
    if not tpv or not pairs:
        return np.empty((0, 8), dtype=np.int64)
    tpv_a, pairs_a = np.array(tpv, dtype=np.int64), np.array(pairs, dtype=np.int64)
    # the (t, p, v) x (d, mb) pairs within the budget at cp 1 first (most of the grid is not),
    # then each crossed with the cp, ep and etp degrees, in the grid's own order
    ij = np.nonzero(tpv_a[:, 0, None] * tpv_a[:, 1, None] * pairs_a[None, :, 0] <= cap)
    k, cp, ep, mode = (a.ravel() for a in np.meshgrid(
        np.arange(len(ij[0])), np.array(cps(m, q), dtype=np.int64),
        np.array(eps(m, q), dtype=np.int64), np.array(etp_modes(m, q), dtype=np.int64),
        indexing="ij"))
    i, j = ij[0][k], ij[1][k]
    (t, p, v), (d, mb) = tpv_a[i].T, pairs_a[j].T
    etp = np.where(mode == 0, t, np.where(mode == 1, 1, -mode))
    n = t * p * d * cp
    # the expert grid etp x ep folds over the tp x cp x dp ranks (Megatron-LM)
    ok = (n <= cap) & ((n <= g) | (n % g == 0)) & ((t * d * cp) % (ep * etp) == 0)
    ok &= (mode != 1) | (t > 1)  # etp = 1 at t = 1 is the default row already
    if q.devices is not None:
        ok &= n == q.devices
    if q.dp_shard:  # HSDP's instances split the expert data-parallel group too
        ok &= hsdp_fits_experts(t, cp, q.dp_shard, ep, etp)
    # the rules of planner.rules that read the split (and sequence parallelism, one value
    # for every choice the search prices)
    (sp,) = {c[1] for c in choices(q)}
    row = SimpleNamespace(t=t, p=p, v=v, d=d, mb=mb, acc=B // (d * mb), cp=cp, ep=ep, etp=etp,
                          sp=sp)
    ok &= rules.mask(m, q, row, rules.SPLIT | {"sp"})
    cols = [x[ok] for x in (t, p, v, d, mb, cp, ep, etp)]
    return np.column_stack(cols)[_order([cols[k] for k in (0, 1, 3, 5, 4, 6, 7, 2)])]


def _order(keys: list[np.ndarray]) -> np.ndarray:
    """`np.lexsort`'s order of integer keys, most significant first: one stable sort of the
    keys packed into one int64 where their ranges fit in 63 bits together (GPT-3 on 4,096
    GPUs needs 49), the eight-key lexsort where they do not (tens of thousands of
    replicas and large batches with expert degrees can pass 63)."""
    if not len(keys[0]):
        return np.empty(0, dtype=np.int64)
    lows = [int(k.min()) for k in keys]
    bits = [(int(k.max()) - lo).bit_length() for k, lo in zip(keys, lows, strict=True)]
    if sum(bits) > 63:
        return np.lexsort(keys[::-1])
    packed = np.zeros(len(keys[0]), dtype=np.int64)
    for k, lo, b in zip(keys, lows, bits, strict=True):
        packed = (packed << b) | (k - lo)
    return np.argsort(packed, kind="stable")


@functools.lru_cache(maxsize=64)
def choices(q: Search) -> tuple[tuple[int, ...], ...]:
    """(recompute, sp, zero, gpipe, then each switch of `planner.switches.PER_ROW`)
    combinations the search prices (see the module docstring), those the rules of
    `planner.rules` reading only them allow; a one-line error where the pins leave none. A
    searched switch is tried on and off (rows it does nothing on keep it off:
    `planner.search.hybrid`), a pinned one takes its value."""
    # partial recomputation is not priced with the activation offload
    recs = ([PARTIAL] if q.recompute_layers else [RECOMPUTE.index(q.recompute)] if q.recompute
            else [0, 1, 2] if q.offload_activations else [0, 1, 2, PARTIAL])
    sps = [int(q.sequence_parallel)] if q.sequence_parallel is not None else [1]
    zeros = [q.zero] if q.zero is not None else [2, 3]
    gp = [int(q.schedule == "gpipe")] if q.schedule else [0]
    own = [[0, 1] if name in q.searched else [int(getattr(q, name))]
           for name in switches.PER_ROW]
    every = [(r, s, z, k, *o) for r in recs for s in sps for z in zeros for k in gp
             for o in itertools.product(*own)]
    ok = [c for c in every
          if rules.mask(None, q, SimpleNamespace(rec=c[0], sp=c[1], zero=c[2]), rules.CHOICE)]
    if not ok:
        rules.refuse(q, SimpleNamespace(rec=every[0][0], sp=every[0][1], zero=every[0][2]),
                     rules.CHOICE)
    return tuple(ok)
