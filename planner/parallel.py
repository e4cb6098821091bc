"""Independent tasks run here, in local processes or on a Dask cluster, streamed as they finish.

`Run` is what `planner batch` and the parallel `planner sweep` share. It yields one `Done` per
item, as each finishes, whatever happens to the workers:

- a task that raises gives its exception (`Done.error`); the other items go on;
- a task whose worker died: Dask reruns it elsewhere (the result is the same); when Dask gives
  up (`KilledWorker`), or a local process crashes running it alone, it is `worker_lost`. A
  group of items sent as one task is split and rerun one by one first, so only the item that
  kills its worker is lost;
- a lost cluster (scheduler gone, unreachable, or no workers and no progress for
  `stall_timeout_s`) ends the run: `Run.lost` says why, and every item not yet finished is
  yielded `cluster_lost`.

Small items are sent in groups sized from the time the finished ones took (about
`TARGET_TASK_S` of work per task), so a cluster is not slower than one process on a batch of
tiny solves. Each worker process keeps its compiled programs (`planner.inputs.build`,
`planner.cost.programs.program`) between tasks: they are module-level caches, and every task
runs in the worker's own process, so planner is imported and a model compiled once per worker.
Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_ set, which also turns off glibc's
adaptive mmap threshold: every numpy temporary above 128 KiB is then mapped and unmapped, which
made warm solves 10-15 % slower inside workers (docs/batch.md). `_tune_worker` restores a large
mmap threshold in the worker process on its first task (Linux with glibc only).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from planner.errors import PlannerError, SpecError
from planner.spec.numbers import short

DEFAULT_STALL_TIMEOUT_S = 120.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
TARGET_TASK_S = 0.5  # work per task once the items' time is known
MAX_GROUP = 64  # items per task at most
TICK_S = 0.25  # how often the loop looks at the cluster when nothing finishes
PROBE_S = 2.0  # how often it asks the scheduler for its workers
EXIT_CLUSTER = 4  # the exit code of a run that lost its cluster or a worker for good

_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


class ClusterError(PlannerError):
    """The cluster could not run the work: unreachable, lost mid-run, no workers for the stall
    timeout, or a task Dask gave up on (exit code 4; `planner batch --resume` finishes)."""

    exit_code = EXIT_CLUSTER


@dataclass(frozen=True)
class Done:
    """One finished item: its position in the input, and its value, or why it has none."""

    index: int
    value: Any = None
    error: BaseException | None = None  # what the task raised
    lost: str | None = None  # 'worker_lost' or 'cluster_lost'
    message: str = ""  # why it was lost

    @property
    def ok(self) -> bool:
        return self.error is None and self.lost is None


@dataclass(frozen=True)
class Progress:
    """Where a run stands: items done (of which failed), in flight, not yet sent, and the
    cluster's workers (None: not a cluster; -1: the scheduler does not answer)."""

    total: int
    done: int
    failed: int
    running: int
    waiting: int
    workers: int | None = None
    no_workers_s: float = 0.0  # how long the cluster has had no workers and made no progress
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S

    def line(self, label: str) -> str:
        failed = f" ({self.failed} failed)" if self.failed else ""
        head = f"{label}: {self.done} of {self.total} done{failed}, "
        if self.workers is None:
            return head + f"{self.running} running, {self.waiting} waiting"
        if self.workers > 0:
            s = "" if self.workers == 1 else "s"
            return head + (f"{self.running} running, {self.waiting} waiting; {self.workers} "
                           f"worker{s}")
        why = "the scheduler does not answer" if self.workers < 0 else "no workers"
        return head + (f"{self.running + self.waiting} waiting for workers ({why} for "
                       f"{self.no_workers_s:.0f} s; --stall-timeout {self.stall_timeout_s:g} s)")


# --- the scheduler address ----------------------------------------------------------------------


def check_address(address: str) -> str:
    """A scheduler address, checked before anything runs: SCHEME://HOST:PORT (tcp, tls, ws,
    wss, ucx) with a port in 1-65535, or inproc://... Anything else is bad input (exit 2)."""
    import re

    if not isinstance(address, str) or not address:
        raise SpecError(f"scheduler: expected an address like tcp://HOST:PORT, got "
                        f"{short(address)}")
    if address.startswith("inproc://"):
        return address
    m = re.fullmatch(r"([a-z]+)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})/?", address)
    if m is None or m.group(1) not in _SCHEMES:
        raise SpecError(f"scheduler: expected an address like tcp://HOST:PORT, got "
                        f"{short(address)}")
    if not 1 <= int(m.group(3)) <= 65535:
        raise SpecError(f"scheduler: port must be in 1-65535, got {short(address)}")
    return address


def dask_client(scheduler: Any, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S):
    """(client, owned): the `distributed.Client` given, or one connected to the address
    within `connect_timeout_s` (owned: closed by whoever asked). A malformed address or no Dask
    is exit 2 at once; an address nobody answers at is a ClusterError (exit 4)."""
    try:
        import distributed
    except ImportError:
        raise SpecError("scheduler: --scheduler needs Dask; pip install 'planner[dask]'") from None
    if isinstance(scheduler, distributed.Client):
        return scheduler, False
    check_address(scheduler)
    try:
        with _quiet_dask():
            client = distributed.Client(scheduler, timeout=connect_timeout_s,
                                        set_as_default=False, name="planner")
    except (OSError, TimeoutError) as exc:
        raise ClusterError(f"scheduler: cannot connect to {short(scheduler)} within "
                           f"{connect_timeout_s:g} s ({_first_line(exc)})") from None
    except ValueError as exc:  # distributed's own parse of the address
        raise SpecError(f"scheduler: {short(scheduler)}: {_first_line(exc)}") from None
    return client, True


def _dask_loggers() -> list[logging.Logger]:
    """Dask's loggers and those of the libraries under it (distributed sets levels on some
    children, 'distributed.client' among them, so each is set, not only the parent)."""
    names = [n for n in list(logging.root.manager.loggerDict)
             if n.split(".")[0] in ("distributed", "tornado", "asyncio")]
    return [logging.getLogger(n) for n in {"distributed", "tornado", "asyncio", *names}]


def quiet_dask_logs() -> None:
    """For the rest of this process, no Dask log line on stderr (the command line: a lost
    cluster is reported once, in one line, also after the client closes in the background)."""
    for logger in _dask_loggers():
        logger.setLevel(logging.CRITICAL + 10)


@contextlib.contextmanager
def _quiet_dask():
    """Dask's client logs (reconnect attempts, closed streams, tracebacks) kept off stderr
    while a run lasts: a lost cluster is reported once, by the caller."""
    saved = [(logger, logger.level) for logger in _dask_loggers()]
    quiet_dask_logs()
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# --- what runs on a worker ----------------------------------------------------------------------

_TUNED = False


def _tune_worker() -> None:
    """Once per worker process: undo what MALLOC_TRIM_THRESHOLD_ (set by Dask's nanny) does to
    glibc's allocator, a fixed 128 KiB mmap threshold, so numpy's temporaries come from the heap
    again. Not Linux / not glibc / not set: nothing to do."""
    global _TUNED
    if _TUNED:
        return
    _TUNED = True
    if not sys.platform.startswith("linux") or "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # glibc malloc.h
        libc.mallopt(m_mmap_threshold, 32 * 2**20)
        libc.mallopt(m_trim_threshold, 64 * 2**20)


def run_group(fn: Callable, items: Sequence) -> list[tuple[bool, Any, float]]:
    """[fn(x) for x in items] as (ok, value or the exception raised, seconds): one task."""
    _tune_worker()
    out = []
    for x in items:
        start = time.perf_counter()
        try:
            out.append((True, fn(x), time.perf_counter() - start))
        except Exception as exc:  # the item's failure, not the task's
            out.append((False, _picklable(exc), time.perf_counter() - start))
    return out


def _picklable(exc: Exception) -> Exception:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


# --- where tasks run ----------------------------------------------------------------------------


class _Lost(Exception):
    """The backend lost its cluster."""


class _Dask:
    """Tasks on a Dask cluster through one client."""

    solo_one_at_a_time = False  # Dask itself decides when a task has killed too many workers

    def __init__(self, scheduler: Any, connect_timeout_s: float):
        self.client, self.owned = dask_client(scheduler, connect_timeout_s)
        self.timeout_s = connect_timeout_s
        self.token = uuid.uuid4().hex[:8]
        self.count = 0
        self.workers: int | None = None  # last answer of the scheduler (-1: no answer)
        self.threads = 1
        self.probed = 0.0
        self.finished = threading.Event()  # set as any task finishes

    def submit(self, fn: Callable, items: list, first: int, solo: bool = False):
        self.count += 1
        future = self.client.submit(run_group, fn, items, pure=False,
                                    key=f"planner-{self.token}-{first}-{self.count}")
        future.add_done_callback(lambda _: self.finished.set())
        return future

    def wait(self, futures: list, timeout_s: float) -> list:
        done = [f for f in futures if f.done()]
        if not done:
            self.finished.wait(timeout_s)
            self.finished.clear()
            done = [f for f in futures if f.done()]
        return done

    def outcome(self, future) -> tuple[str, Any]:
        """('ok', results) | ('killed', why) | ('error', exception); _Lost when the cluster
        is gone; ('again', None) when the result is not there yet after all."""
        from distributed.client import FutureCancelledError

        status = future.status
        if status == "cancelled" or self.client.status in ("closing", "closed", "connecting"):
            raise _Lost("lost the connection to the scheduler")
        try:
            if status == "error":
                exc = future.exception(timeout=self.timeout_s)
                if type(exc).__name__ == "KilledWorker":
                    return "killed", _first_line(exc)
                return "error", exc
            return "ok", future.result(timeout=self.timeout_s)
        except (FutureCancelledError, OSError) as exc:
            raise _Lost(f"lost the connection to the scheduler ({_first_line(exc)})") from None
        except TimeoutError:
            return "again", None

    def probe(self) -> int:
        """The scheduler's workers now (asked every PROBE_S); -1 when it does not answer."""
        now = time.monotonic()
        if self.workers is not None and now - self.probed < PROBE_S:
            return self.workers
        self.probed = now
        if self.client.status in ("closing", "closed"):
            raise _Lost("the client closed")
        try:
            info = self.client.sync(self.client.scheduler.identity, n_workers=0,
                                    callback_timeout=min(self.timeout_s, 5.0))
            self.workers = int(info.get("n_workers", 0))
            self.threads = max(1, int(info.get("total_threads", 1) or 1))
        except Exception:
            self.workers = -1
        return self.workers

    def cancel(self, futures: list, lost: bool) -> None:
        if not lost and futures:
            with contextlib.suppress(Exception):
                self.client.cancel(futures)

    def close(self, abort: bool = False) -> None:
        if self.owned:
            with contextlib.suppress(Exception):
                self.client.close(timeout=2)


class _Local:
    """Tasks in a pool of local processes. A crashed process breaks the whole pool: the items
    that were in it are rerun one at a time, alone, in a fresh pool; one that crashes alone is
    lost."""

    solo_one_at_a_time = True

    def __init__(self, workers: int):
        self.size = workers
        self.pool = None
        self.alone = None  # the one-process pool for suspects
        self.threads = workers
        self.workers = None

    def _pool(self, solo: bool):
        from concurrent.futures import ProcessPoolExecutor

        if solo:
            if self.alone is None:
                self.alone = ProcessPoolExecutor(max_workers=1)
            return self.alone
        if self.pool is None:
            self.pool = ProcessPoolExecutor(max_workers=self.size)
        return self.pool

    def submit(self, fn: Callable, items: list, first: int, solo: bool = False):
        future = self._pool(solo).submit(run_group, fn, items)
        future.solo = solo
        return future

    def wait(self, futures: list, timeout_s: float) -> list:
        from concurrent.futures import FIRST_COMPLETED, wait

        return list(wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED).done)

    def outcome(self, future) -> tuple[str, Any]:
        from concurrent.futures.process import BrokenProcessPool

        try:
            return "ok", future.result()
        except BrokenProcessPool as exc:
            if future.solo:
                self.alone = None
            else:
                self.pool = None
            why = f"a local worker process died ({_first_line(exc)})"
            return ("killed" if future.solo else "broken"), why
        except Exception as exc:
            return "error", exc

    def probe(self) -> None:
        return None

    def cancel(self, futures: list, lost: bool) -> None:
        for f in futures:
            f.cancel()

    def close(self, abort: bool = False) -> None:
        for pool in (self.pool, self.alone):
            if pool is None:
                continue
            if abort:  # an interrupted run does not wait for the solves in flight
                for process in list(getattr(pool, "_processes", {}).values()):
                    with contextlib.suppress(Exception):
                        process.kill()
            with contextlib.suppress(Exception):
                pool.shutdown(wait=True, cancel_futures=True)


def cores() -> int:
    """The cores this process may run on (what `--jobs 0` uses)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# --- the run ------------------------------------------------------------------------------------


class Run:
    """fn over items, streamed: iterate for one `Done` per item as each finishes (any order).

    jobs = 1 without a scheduler runs here, one after the other; jobs > 1 (0: every core) in
    that many local processes; `scheduler` (an address 'tcp://HOST:PORT' or a
    `distributed.Client`) on that Dask cluster, connecting within `connect_timeout_s`.
    `on_progress(Progress)` is called as items finish and about every TICK_S while waiting.
    After the iteration `lost` is None, or why the cluster was lost."""

    def __init__(self, fn: Callable, items: Sequence, *, jobs: int = 1, scheduler: Any = None,
                 stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 on_progress: Callable[[Progress], None] | None = None):
        if jobs < 0:
            raise SpecError(f"jobs: must be 0 (every core) or a positive number, got {jobs}")
        for name, value in (("stall_timeout_s", stall_timeout_s),
                            ("connect_timeout_s", connect_timeout_s)):
            if not 0 < value <= 1e6:
                raise SpecError(f"{name}: must be in (0, 1e6] seconds, got {value}")
        self.fn, self.items = fn, list(items)
        self.jobs, self.scheduler = jobs, scheduler
        self.stall_timeout_s, self.connect_timeout_s = stall_timeout_s, connect_timeout_s
        self.on_progress = on_progress
        self.lost: str | None = None
        self._seconds: deque[float] = deque(maxlen=64)  # the latest items' times

    def __iter__(self) -> Iterator[Done]:
        if self.scheduler is None and (min(cores() if self.jobs == 0 else self.jobs,
                                           len(self.items)) <= 1):
            yield from self._here()
            return
        backend = (_Dask(self.scheduler, self.connect_timeout_s) if self.scheduler is not None
                   else _Local(min(cores() if self.jobs == 0 else self.jobs, len(self.items))))
        complete = False
        with _quiet_dask() if self.scheduler is not None else contextlib.nullcontext():
            try:
                yield from self._loop(backend)
                complete = True
            finally:
                backend.close(abort=not complete)

    def _here(self) -> Iterator[Done]:
        failed = 0
        for k, x in enumerate(self.items):
            ((ok, value, _),) = run_group(self.fn, [x])
            failed += not ok
            yield Done(k, value) if ok else Done(k, error=value)
            self._report(k + 1, failed, 0, len(self.items) - k - 1, None, 0.0)

    def _report(self, done, failed, running, waiting, workers, idle) -> None:
        if self.on_progress is not None:
            self.on_progress(Progress(len(self.items), done, failed, running, waiting, workers,
                                      idle, self.stall_timeout_s))

    def _group_size(self, waiting: int, threads: int) -> int:
        """Items per task: about TARGET_TASK_S of work at the latest items' mean time, at most
        MAX_GROUP, and small enough that the last tasks still spread over the workers."""
        if not self._seconds:
            return 1
        mean = sum(self._seconds) / len(self._seconds)
        size = int(TARGET_TASK_S / max(mean, 1e-4))
        return max(1, min(size, MAX_GROUP, waiting // (2 * max(threads, 1))))

    def _loop(self, backend) -> Iterator[Done]:
        waiting = deque(range(len(self.items)))  # not yet sent
        solo: set[int] = set()  # sent alone from now on (their group lost a worker)
        in_flight: dict[Any, list[int]] = {}
        finished: set[int] = set()
        failed = 0
        alive = time.monotonic()  # the last moment with workers or progress
        try:
            while waiting or in_flight:
                try:
                    workers = backend.probe()
                except _Lost as exc:
                    self.lost = str(exc)
                    break
                now = time.monotonic()
                if workers is None or workers > 0:
                    alive = now
                elif now - alive > self.stall_timeout_s:
                    why = "no workers" if workers == 0 else "the scheduler did not answer"
                    self.lost = (f"{why} and no progress for {self.stall_timeout_s:g} s "
                                 f"(--stall-timeout)")
                    break
                self._send(backend, waiting, solo, in_flight)
                for future in backend.wait(list(in_flight), TICK_S):
                    items = in_flight.pop(future)
                    try:
                        kind, got = backend.outcome(future)
                    except _Lost as exc:
                        self.lost = str(exc)
                        in_flight[future] = items
                        break
                    if kind == "again":
                        in_flight[future] = items
                    elif kind == "ok":
                        alive = time.monotonic()
                        for k, (ok, value, seconds) in zip(items, got, strict=True):
                            self._seconds.append(seconds)
                            finished.add(k)
                            failed += not ok
                            yield Done(k, value) if ok else Done(k, error=value)
                    elif len(items) > 1 or kind == "broken":
                        # which item killed its worker is not known: each runs alone
                        solo.update(items)
                        waiting.extendleft(reversed(items))
                    elif kind == "killed":
                        finished.add(items[0])
                        failed += 1
                        yield Done(items[0], lost="worker_lost", message=got)
                    else:  # the task itself failed (not an item: those are caught in it)
                        for k in items:
                            finished.add(k)
                            failed += 1
                            yield Done(k, error=got)
                if self.lost:
                    break
                running = sum(len(v) for v in in_flight.values())
                idle = 0.0 if workers is None or workers > 0 else time.monotonic() - alive
                self._report(len(finished), failed, running, len(waiting), workers, idle)
        finally:
            backend.cancel(list(in_flight), self.lost is not None)
        if self.lost:
            for k in range(len(self.items)):
                if k not in finished:
                    yield Done(k, lost="cluster_lost", message=self.lost)

    def _send(self, backend, waiting: deque, solo: set, in_flight: dict) -> None:
        """Keep about two tasks per worker thread queued (at least two)."""
        cap = max(2, 2 * backend.threads)
        solos = sum(1 for items in in_flight.values() if items[0] in solo)
        while waiting and len(in_flight) < cap:
            if waiting[0] in solo:
                if backend.solo_one_at_a_time and solos:
                    return
                group, solos = [waiting.popleft()], solos + 1
            else:
                size = self._group_size(len(waiting), backend.threads)
                group = []
                while waiting and len(group) < size and waiting[0] not in solo:
                    group.append(waiting.popleft())
            future = backend.submit(self.fn, [self.items[k] for k in group], group[0],
                                    solo=group[0] in solo)
            in_flight[future] = group


def parallel_map(fn: Callable, items: Sequence, *, jobs: int = 1, scheduler: Any = None,
                 on_done: Callable[[], None] | None = None,
                 stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 on_progress: Callable[[Progress], None] | None = None) -> list:
    """[fn(x) for x in items], in input order, run as `Run` runs them (`scheduler`: an address
    or a `distributed.Client`). `on_done` is called once per finished item, `on_progress` as
    `Run` calls it. The exception `fn` raised for the earliest item is raised here, after
    every item has finished; an item whose worker was lost, or a lost cluster, is a
    ClusterError (exit code 4)."""
    items = list(items)
    out: list = [None] * len(items)
    failed: tuple[int, BaseException] | None = None
    run = Run(fn, items, jobs=jobs, scheduler=scheduler, stall_timeout_s=stall_timeout_s,
              connect_timeout_s=connect_timeout_s, on_progress=on_progress)
    for done in run:
        if on_done is not None:
            on_done()
        if done.lost == "worker_lost":
            raise ClusterError(f"task {done.index + 1}: its worker died and was not replaced, "
                               f"or Dask gave up on it ({done.message})")
        if done.lost:
            break
        if done.error is not None:
            if failed is None or done.index < failed[0]:
                failed = (done.index, done.error)
        else:
            out[done.index] = done.value
    if run.lost:
        raise ClusterError(f"cluster lost: {run.lost}")
    if failed is not None:
        raise failed[1]
    return out
