"""`planner batch`: many solves from one file of scenarios, locally or on a Dask cluster,
streamed as they finish and resumable (`docs/batch.md`). Also the cluster options and the
progress report `planner sweep` shares."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import click

from planner.cli.options import parallel_check, parallel_options, with_options
from planner.cli.params import FiniteFloat
from planner.parallel import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_STALL_TIMEOUT_S,
    EXIT_CLUSTER,
    ClusterError,
    Progress,
)

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
DEFAULT_PROGRESS_EVERY_S = 30.0


def cluster_options(f):
    """--stall-timeout / --connect-timeout / --progress-every: how long a run waits for its
    cluster, and how often it says where it stands."""
    opts = [
        click.option("--stall-timeout", type=FiniteFloat(0, 1e6, min_open=True),
                     default=DEFAULT_STALL_TIMEOUT_S, show_default=True, metavar="SECONDS",
                     help="With --scheduler: stop as a lost cluster (exit 4) after this long "
                          "with no workers (or no answer from the scheduler) and no progress."),
        click.option("--connect-timeout", type=FiniteFloat(0, 1e6, min_open=True),
                     default=DEFAULT_CONNECT_TIMEOUT_S, show_default=True, metavar="SECONDS",
                     help="With --scheduler: give up connecting after this long (exit 4); "
                          "also the limit on each request to the scheduler."),
        click.option("--progress-every", type=FiniteFloat(0, 1e6), metavar="SECONDS",
                     default=DEFAULT_PROGRESS_EVERY_S, show_default=True,
                     help="When stderr is not a terminal, a progress line this often (done / "
                          "running / waiting for workers); 0: none. A terminal gets a bar."),
    ]
    return with_options(f, opts)


class Reporter:
    """Progress on stderr: a bar on a terminal, else one line every `every_s` seconds."""

    def __init__(self, label: str, total: int, every_s: float):
        self.label, self.every_s = label, every_s
        self.start = self.last = time.monotonic()
        self.bar = None
        self.shown = 0
        if sys.stderr.isatty() and total:
            self.bar = click.progressbar(length=total, label=label, file=sys.stderr)
            self.bar.__enter__()

    def __call__(self, p: Progress) -> None:
        if self.bar is not None:
            self.bar.update(p.done - self.shown)
            self.shown = p.done
            return
        now = time.monotonic()
        if self.every_s and now - self.last >= self.every_s:
            self.last = now
            click.echo(f"planner: {p.line(self.label)} ({now - self.start:.0f} s)", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a batch system's time limit): stop as Ctrl-C does, writing what finished."""


class _Writing:
    """Set while a line is being written: SIGTERM then waits for the line to be whole."""

    busy = False
    pending = False

    def __enter__(self):
        self.busy = True

    def __exit__(self, *exc):
        self.busy = False

    def take(self) -> bool:
        """Whether a SIGTERM came while writing (once)."""
        pending, self.pending = self.pending, False
        return pending


@contextlib.contextmanager
def on_sigterm(writing: _Writing | None = None):
    """SIGTERM raises _Terminated in the main thread while the run lasts (after the line being
    written, if any)."""
    parent = os.getpid()

    def handler(signum, frame):
        if os.getpid() != parent:  # a forked local worker: end quietly
            os._exit(128 + signum)
        if writing is not None and writing.busy:
            writing.pending = True
            return
        raise _Terminated

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (a test runner's thread): leave it
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def check_scheduler(scheduler: str | None) -> None:
    """A --scheduler that cannot work is bad input before anything runs: no Dask, or an
    address that is not SCHEME://HOST:PORT."""
    if scheduler is None:
        return
    from planner.errors import SpecError
    from planner.parallel import check_address, quiet_dask_logs

    try:
        import distributed  # noqa: F401
    except ImportError:
        raise SpecError("scheduler: --scheduler needs Dask; pip install 'planner[dask]'") from None
    check_address(scheduler)
    quiet_dask_logs()


class _Sink:
    """Where the lines go, opened at the first line (a run that cannot start leaves FILE as it
    was), written and flushed line by line. When FILE is also the --resume file the lines go
    to FILE.partial, renamed over FILE when the run ends (any way but a kill -9, which leaves
    FILE as it was)."""

    def __init__(self, output: str | None, resume: str | None):
        self.output = output
        self.replace = (output is not None and resume is not None
                        and os.path.realpath(output) == os.path.realpath(resume))
        self.path = f"{output}.partial" if self.replace else output
        self.file = None

    def write(self, line: str) -> None:
        if self.output is None:
            click.echo(line)
            sys.stdout.flush()
            return
        if self.file is None:
            from planner.errors import SpecError

            try:
                self.file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
            except OSError as exc:
                raise SpecError(f"output: cannot write {self.output} ({exc.strerror})") from None
        self.file.write(line + "\n")
        self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            if self.replace:
                os.replace(self.path, self.output)


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@parallel_options
@click.option("--ordered/--as-finished", default=True, show_default=True,
              help="Lines in input order (holding back only what is not yet in order), or "
                   "each as soon as its scenario finishes.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the lines to FILE (line by line, flushed) instead of stdout.")
@click.option("--resume", type=click.Path(dir_okay=False), metavar="FILE",
              help="A partial output of this batch: its answered scenarios are copied, not "
                   "run again (a missing FILE answers none).")
@cluster_options
def batch(file, jobs, scheduler, ordered, output, resume, stall_timeout, connect_timeout,
          progress_every):
    """Many solves from FILE: a YAML list of scenarios (.yaml / .yml), a JSON list (.json) or
    one JSON object per line (.jsonl; '-' reads stdin). A scenario's keys are solve's options,
    underscored ({model: llama3-8b, hardware: dgx-h100, global_batch: 512, devices_max: 64};
    switches true / false). Every scenario is checked before any runs; an unknown key, a bad
    value or a file with no scenario is exit 2, naming the scenario and the key.

    Prints one JSON line per scenario as each finishes (in input order by default): the
    document `planner solve --format json` prints for it, or its JSON error document, with a
    "scenario" key (index, input line, options). A scenario whose worker died for good is a
    "worker_lost" line; when the cluster is lost (or has no workers for --stall-timeout) the
    run ends with a "cluster_lost" line for each scenario not finished, one message, and exit
    4. Rerun with --resume OUTPUT to finish. Exits with the worst scenario's code otherwise.

    \b
    Examples:
      planner batch scenarios.yaml
      planner batch scenarios.jsonl --jobs 0 > plans.jsonl
      planner batch scenarios.yaml --scheduler tcp://10.0.0.5:8786 -o plans.jsonl
      planner batch scenarios.yaml --scheduler tcp://10.0.0.5:8786 -o plans.jsonl \\
          --resume plans.jsonl
    """
    from planner.batch import BatchRun, answered, scenarios

    parallel_check(jobs, scheduler)
    check_scheduler(scheduler)
    todo = scenarios(file)
    done = answered(resume, todo) if resume is not None else {}
    reporter = Reporter("batch", len(todo) - len(done), progress_every)
    run = BatchRun(todo, jobs=jobs, scheduler=scheduler, ordered=ordered, done=done,
                   stall_timeout_s=stall_timeout, connect_timeout_s=connect_timeout,
                   on_progress=reporter)
    sink = _Sink(output, resume)
    written, writing = 0, _Writing()
    try:
        with on_sigterm(writing):
            lines = iter(run)
            while True:
                try:  # a SIGTERM deferred while writing goes in where the run waits
                    r = lines.throw(_Terminated()) if writing.take() else next(lines)
                except StopIteration:
                    break
                with writing:
                    sink.write(r.text)
                    written += 1
                    if r.kind != "cluster_lost":
                        for line in r.stderr:
                            click.echo(f"planner: scenario {r.scenario.index}: "
                                       f"{line.removeprefix('planner: ')}", err=True)
                        if r.kind == "worker_lost":
                            click.echo(f"planner: scenario {r.scenario.index}: "
                                       f"{r.doc['error']['message']}", err=True)
    except KeyboardInterrupt as exc:
        reporter.close()
        sink.close()
        what = "terminated" if isinstance(exc, _Terminated) else "interrupted"
        click.echo(f"planner: batch: {what}; {written} of {len(todo)} lines written"
                   f"{_resume_hint(output, file)}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        reporter.close()
        sink.close()
    if run.lost:
        click.echo(f"planner: batch: cluster lost: {run.lost}; {run.unanswered} of "
                   f"{len(todo)} scenarios not answered ('cluster_lost' lines)"
                   f"{_resume_hint(output, file)}", err=True)
        sys.exit(EXIT_CLUSTER)
    if run.exit_code:
        sys.exit(run.exit_code)


def _resume_hint(output: str | None, file: str) -> str:
    if output:
        return f"; finish with: planner batch {file} -o {output} --resume {output}"
    return "; finish with --resume FILE (FILE: the lines written so far)"


__all__ = ["EXIT_CLUSTER", "ClusterError", "Reporter", "batch", "check_scheduler",
           "cluster_options", "on_sigterm"]
