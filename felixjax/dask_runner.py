"""Builds and measurements on a Dask cluster (DESIGN.md "Scale out"): ``fj.tune(..., runner=fj.DaskRunner(client))``.

The driver (the tuning session, its database and its cost model) stays where it is; a batch of
candidates is sent to the cluster as Dask tasks and the results come back **in the batch's order**,
so a run through Dask records the same configs and statuses in the same order as a local run.

* **Devices.** Measuring workers advertise a resource (``dask worker --nthreads 1 --resources
  device=1``); every measurement asks for one unit of it, so two measurements never share a device.
* **Builds** never run on cores being timed. ``builds="cluster"``: on workers advertising ``build``
  (``--resources build=2``), pipelined with the measurements; ``"device"``: inside the measuring
  task, on the measuring host between its measurements (a one-thread worker runs one task at a
  time, and the measuring lock is not held while compiling); ``"driver"``: here, in parallel, the
  libraries shipped; ``"auto"`` (default): ``"cluster"`` when some worker advertises ``build``, else
  ``"device"``. Libraries travel as bytes, so builders and measurers need not share a disk; builds
  use ``flags`` (``-march=native`` of the *builder*: on a mixed cluster pass the measuring host's
  ``-march``).
* **Daemonic workers.** Dask's worker processes are daemonic and may not start ``multiprocessing``
  children, so the local runner's spawned measuring child is refused there. Each measuring worker
  keeps one long-lived :class:`~codegen.run.subproc.SubprocessRunner` whose measuring child is a
  ``subprocess`` (``python -m codegen.run.measure_child``; same protocol, lock, canaries and hang
  detection); a kernel that crashes kills that child, never the worker. Worker-side code is in
  :mod:`codegen.run.remote` and imports neither felixjax nor jax.
* **A worker dying** mid-measurement: Dask re-runs its task up to the scheduler's
  ``allowed-failures``, then reports it; the runner re-queues such a candidate ``requeue`` (1) more
  time, then records it as a ``runtime_error``. Dask reports every task queued on the dead worker
  too (a ``KilledWorker`` naming that worker): only the one it was running is charged a try, the rest
  are re-queued as they were. Which one ran: each measuring task logs a start event
  (:data:`START_TOPIC`) naming itself and its worker; where that event never arrived (a kernel
  killing its worker at once), the dead worker's highest-priority task (a worker runs its tasks in
  priority order: a batch's order). Charging the first unfinished candidates of the batch instead
  recorded, with two measuring workers, candidates queued on the dead one that never ran as
  failures (a user's review: 3 of 16). A candidate Dask cancels (its scattered input arrays were
  lost with the workers holding them; they are scattered again) is re-queued uncharged. Results
  are fetched as soon as they finish and every record is committed by the session as it arrives:
  nothing measured is lost. (With ``allowed-failures`` 0, as :func:`local_cluster` sets, a killer is
  re-queued exactly once.)
* **A worker without a compiler** (``builds="device"`` or ``"cluster"``): its candidates are
  ``compile_error`` records, as in a local run with no ``gcc``, their error naming the worker
  (``on the Dask worker tcp://... (host H, pid P): cannot run gcc: ...``).
* **The scheduler going away**: :class:`SchedulerLostError` after ``lost_after_s`` without it; what
  was measured is in the database, unmeasured claims are released, and running the same command
  again resumes the run. No worker advertising the device resource for ``no_device_s`` while work
  waits is :class:`NoDeviceError` (instead of waiting forever). :func:`local_cluster` keeps a
  measuring worker that dies again and again (Dask's ``SpecCluster`` would drop one that stays away
  for ``lost-worker-timeout`` while its nanny restarts it).

Example (not run here: it starts worker processes):
    >>> from distributed import Client                                       # doctest: +SKIP
    >>> cluster = local_cluster(); client = Client(cluster)                  # doctest: +SKIP
    >>> fj.tune(fj.ops.matmul(64, 64, 64), runner=DaskRunner(client))        # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import queue
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from codegen.build import DEFAULT_FLAGS, BuildResult, CacheWriteError, build_many
from codegen.measure import MeasureResult, RunRequest, TimingProtocol
from codegen.run import remote
from codegen.run.subproc import SubprocessRunner

BUILD_MODES = ("auto", "cluster", "device", "driver")
SCATTER_TIMEOUT_S = 30.0  # one attempt of broadcasting a request's arrays (normally milliseconds)
START_TOPIC = "felixjax-measure-start"  # the Dask event a measuring task logs as it starts (codegen.run.remote)
DEATH_GRACE_S = 0.3  # after a worker's first reported task, the wait for the rest of its tasks' reports
CANCELS_FREE = 2  # times a candidate may come back "cancelled" (inputs lost with dead workers) uncharged


class ClusterError(RuntimeError):
    """The cluster cannot go on (records so far are in the database: run again to resume)."""


class SchedulerLostError(ClusterError):
    """The Dask scheduler went away mid-run."""


class NoDeviceError(ClusterError):
    """No worker advertising the measuring resource for ``no_device_s``."""


class DaskRunner:
    """A runner placing builds and measurements on a Dask cluster (see the module docs).

    Args:
        client: a :class:`distributed.Client`.
        builds: ``"auto"``, ``"cluster"``, ``"device"`` or ``"driver"`` (where compiles run).
        protocol, timeout_s: the timing protocol and first-call limit of the measuring runners.
        flags, build_timeout_s: compiler flags and the limit of one compile.
        build_workers: parallel compiles on the driver (``builds="driver"``).
        measure_cpus: CPUs the measuring children are pinned to (kernels then run with at most that
            many threads); ``build_cpus``: CPUs compiles are pinned to. On a 2-core host: ``(0,)``
            and ``(1,)``.
        worker_runner: a picklable ``() -> Runner`` made once per measuring worker process (default: a
            :class:`~codegen.run.subproc.SubprocessRunner`; tests pass a source-level replay).
        resource: the resource measuring workers advertise (one unit per measurement).
        requeue: re-submissions of a candidate whose worker died, before it is a failure.
        lost_after_s: seconds without a scheduler before :class:`SchedulerLostError`.
        no_device_s: seconds with work waiting and no worker advertising ``resource`` before
            :class:`NoDeviceError` (instead of waiting forever).
    """

    def __init__(self, client: Any, *, builds: str = "auto", protocol: TimingProtocol | None = None,
                 timeout_s: float = 10.0, flags: Sequence[str] = DEFAULT_FLAGS, build_timeout_s: float = 60.0,
                 build_workers: int = 2, measure_cpus: Iterable[int] | None = None,
                 build_cpus: Iterable[int] | None = None, worker_runner: Callable[[], Any] | None = None,
                 resource: str = "device", requeue: int = 1, lost_after_s: float = 30.0,
                 no_device_s: float = 120.0):
        if builds not in BUILD_MODES:
            raise ValueError(f"builds={builds!r}: expected one of {BUILD_MODES}")
        if isinstance(client, str):  # session 80: read as a lost scheduler ("'str' object has no attribute ...")
            raise TypeError(f"DaskRunner takes a distributed.Client (got the string {client!r}); "
                            f"felixjax.dask_runner.connect({client!r}) connects to an address")
        if client is None or isinstance(client, (int, float, bytes)):  # failed later as a lost scheduler
            raise TypeError(f"DaskRunner takes a distributed.Client (got {client!r}); "
                            f"felixjax.dask_runner.connect('tcp://host:port') connects to a scheduler")
        self.client = client
        self.builds = builds
        self.flags, self.build_timeout_s, self.build_workers = tuple(flags), float(build_timeout_s), build_workers
        self.measure_cpus = tuple(measure_cpus) if measure_cpus is not None else None
        self.build_cpus = tuple(build_cpus) if build_cpus is not None else None
        self.factory = worker_runner or functools.partial(
            SubprocessRunner, protocol=protocol or TimingProtocol(), timeout_s=timeout_s, cpus=self.measure_cpus,
            flags=self.flags, build_timeout_s=self.build_timeout_s, build_workers=1)
        self.resource, self.requeue, self.lost_after_s = resource, int(requeue), float(lost_after_s)
        self.no_device_s = float(no_device_s)
        self.requeued = 0  # candidates re-submitted after a worker died (for logs and tests)
        self._device_peak = 0  # the most measuring workers seen (candidates on a device at once)
        self._scattered: dict[int, tuple[Any, Any]] = {}  # id(array) -> (array, future)
        self._shipped: dict[str, remote.Shipped] = {}  # Runner-protocol builds: key -> shipped build
        self._stranded: list[tuple[int, MeasureResult]] = []  # see take_stranded
        self._device_sources: dict[str, str] = {}  # Runner-protocol builds made when measured: key -> source

    def __repr__(self) -> str:
        return f"DaskRunner({getattr(self.client, 'scheduler', None)!r}, builds={self.builds!r})"

    # ---- where builds go -------------------------------------------------------------------------
    def build_mode(self) -> str:
        """The effective build placement (``"auto"`` resolved against the cluster's workers now)."""
        if self.builds != "auto":
            return self.builds
        workers = self._scheduler_info().get("workers", {})
        return "cluster" if any(w.get("resources", {}).get("build") for w in workers.values()) else "device"

    def _devices(self) -> int:
        """Workers advertising the measuring resource now (the most seen is kept in ``_device_peak``)."""
        workers = self._scheduler_info().get("workers", {})
        n = sum(1 for w in workers.values() if w.get("resources", {}).get(self.resource))
        self._device_peak = max(self._device_peak, n)
        return n

    def _scheduler_info(self) -> dict:
        try:
            try:
                return self.client.scheduler_info(n_workers=-1)  # every worker (some versions list 5)
            except TypeError:  # older clients: no n_workers, every worker
                return self.client.scheduler_info()
        except Exception as e:  # noqa: BLE001 - any comm failure means no scheduler
            raise SchedulerLostError(f"cannot reach the Dask scheduler: {e}") from e

    def _builds(self, sources: Sequence[str], mode: str) -> list[Any]:
        """Per source: a future of a shipped build (cluster), a shipped build (driver), or None (device)."""
        if mode == "device":
            return [None] * len(sources)
        unique = list(dict.fromkeys(sources))
        if mode == "driver":
            done = build_many(unique, workers=self.build_workers, flags=self.flags, timeout_s=self.build_timeout_s)
            ship = {s: remote.Shipped(b, _read(b)) for s, b in zip(unique, done)}
        else:
            ship = {s: self.client.submit(remote.build_job, s, self.flags, self.build_timeout_s, self.build_cpus,
                                          resources={"build": 1}, pure=False) for s in unique}
        return [ship[s] for s in sources]

    # ---- measuring ---------------------------------------------------------------------------------
    def _data(self, request: RunRequest) -> tuple[list, Any]:
        """The request's arrays as futures, scattered once to every worker (cached while alive), or
        the arrays themselves where the broadcast failed (:meth:`_scatter`)."""
        out = []
        for a in [*request.inputs, request.expected]:
            hit = self._scattered.get(id(a))
            if hit is None or hit[0] is not a or (hit[1] is not a and hit[1].status != "finished"):
                if len(self._scattered) > 64:
                    self._scattered.clear()
                hit = (a, self._scatter(a))
                self._scattered[id(a)] = hit
            out.append(hit[1])
        return out[:-1], out[-1]

    def _scatter(self, a: Any, attempts: int = 2) -> Any:
        """``client.scatter(a)`` to every worker, or ``a`` itself when that fails while the client still
        runs: the array then travels inline with each task that needs it (no broadcast, no replication).
        A worker that vanishes mid-broadcast (a measuring worker restarted by its nanny after a crashing
        kernel) surfaces as a closed comm or a timeout (``OSError``), or as the scheduler's own
        ``KeyError`` for the worker it removed while replicating to it (CI, stop 38); one more attempt
        follows, then the inline fallback: the scheduler can go on trying to replicate to the dead
        worker for minutes (CI, sessions 36-37: six 30-s attempts all timed out)."""
        for attempt in range(attempts):
            try:
                # hash=False: a content-hashed key is shared by every runner on the cluster, and a new
                # scatter racing with the release of an earlier runner's copy left two workers
                # gathering the key from each other for 19 minutes (test_dask under pytest-xdist, load 3);
                # unique keys avoid the race, and ``_scattered`` already sends each array once
                return self._scatter_once(a)
            except (OSError, KeyError):  # distributed's CommClosedError and TimeoutError are OSErrors
                if self.client.status != "running":
                    raise
                if attempt < attempts - 1:
                    time.sleep(0.5)
                    with contextlib.suppress(Exception):
                        self.client.wait_for_workers(1, timeout=30)
        return a

    def _scatter_once(self, a: Any) -> Any:
        """One broadcast of ``a``, bounded by :data:`SCATTER_TIMEOUT_S` as a whole: ``Client.scatter``'s
        own ``timeout`` only bounds the wait for workers, and a broadcast caught by a worker's death
        waited forever (a test hung > 10 min in ``Client.scatter`` after killing its measuring worker).
        The bound goes through ``Client.sync``'s ``callback_timeout`` (a ``TimeoutError``, an
        ``OSError``); where that private call shape is refused, the plain ``Client.scatter``."""
        kwargs = {"hash": False, "broadcast": True, "timeout": SCATTER_TIMEOUT_S}
        try:
            return self.client.sync(self.client._scatter, a, workers=None, direct=None, local_worker=None,
                                    callback_timeout=SCATTER_TIMEOUT_S, **kwargs)
        except TypeError:  # another distributed version's _scatter signature
            return self.client.scatter(a, **kwargs)

    def _submit(self, source: str, request: RunRequest, build: Any, priority: int = 0) -> Any:
        """One measurement task; ``priority``: higher runs first on its worker (a batch's own order, so
        results arrive, and are committed, in order instead of waiting behind a later one)."""
        if self.measure_cpus is not None:
            request = dataclasses.replace(request, threads=max(1, min(request.threads, len(self.measure_cpus))))
        inputs, expected = self._data(request)
        bare = dataclasses.replace(request, inputs=[], expected=None)
        return self.client.submit(remote.measure_job, self.factory, bare, inputs, expected,
                                  source if build is None else None, build, self.build_cpus, START_TOPIC,
                                  resources={self.resource: 1}, pure=False, priority=priority)

    def measure_stream(self, sources: Sequence[str], requests: Sequence[RunRequest]) -> Iterator[MeasureResult]:
        """Build and measure a batch on the cluster; yield one result per request, **in order**.

        Everything is submitted at once (builds and measurements pipeline across workers), the
        measurements with priorities in the batch's order, so a worker with several ready runs them in
        order; each result is fetched from the cluster as soon as it is ready, and held here until those
        before it are yielded (without the priorities a driver killed mid-batch lost measurements held
        behind an earlier one: 10 finished, 3 committed, in a user's review). Closing the generator early
        cancels what has not run yet.
        """
        sources, requests = list(sources), list(requests)
        self._stranded = []  # a batch before this one's (a code review: handed over when this one failed to start)
        if len(sources) != len(requests):
            raise ValueError("one source per request")
        if requests:
            self._guard(self._await_device, len(requests))
            yield from self._stream(sources, requests, self._guard(self._builds, sources, self.build_mode()))

    def _await_device(self, waiting: int) -> None:
        """Return once a worker advertises the measuring resource; :class:`NoDeviceError` after
        ``no_device_s`` without one. Checked before anything is sent: with no worker at all, sending the
        arrays (a broadcast, retried, then inline) took minutes before the idle clock below began (a
        user's review saw the error after 9 min 43 s)."""
        since = time.monotonic()
        while self._devices() == 0:
            if time.monotonic() - since > self.no_device_s:
                raise NoDeviceError(self._no_device_message(waiting))
            time.sleep(1.0)

    def _no_device_message(self, waiting: int) -> str:
        return (f"no worker of the Dask cluster at {_address(self.client)} advertises the {self.resource!r} "
                f"resource for {self.no_device_s:g} s: {waiting} candidates wait. Start one (dask worker ADDRESS "
                f"--nthreads 1 --resources {self.resource}=1; workers stop when their scheduler does) and rerun "
                f"the same command to resume.")

    def _guard(self, fn: Callable, *args: Any) -> Any:
        try:
            return fn(*args)
        except SchedulerLostError:
            raise
        except Exception as e:  # noqa: BLE001
            if self.client.status != "running":
                raise SchedulerLostError(f"lost the Dask scheduler {_address(self.client)}: {e}; "
                                         f"start it and its workers again (they stop with it) and rerun the same command to "
                                         f"resume") from e
            raise

    def take_stranded(self) -> list[tuple[int, MeasureResult]]:
        """(index, result) of the candidates of the last stream that finished but were never yielded (a later
        one than a candidate still measuring when the stream stopped: Ctrl-C, a lost scheduler), once: the
        Measurer records them when a stream ends by an exception (session 80: a review lost 2 of 7)."""
        out, self._stranded = self._stranded, []
        return out

    def _stream(self, sources: list, requests: list, builds: list) -> Iterator[MeasureResult]:
        n = len(sources)
        futs = [self._guard(self._submit, s, r, b, n - i) for i, (s, r, b) in enumerate(zip(sources, requests, builds))]
        with contextlib.suppress(SchedulerLostError):
            self._devices()  # how many candidates can be on a device at once (see the re-queue below)
        index = {f.key: i for i, f in enumerate(futs)}
        prio = [n - i for i in range(n)]
        charged: dict[tuple, Any] = {}  # a dead worker (address, id) -> the key of the task it was running
        tries, cancels = [0] * len(futs), [0] * len(futs)
        done: dict[int, MeasureResult] = {}
        ready: queue.Queue = queue.Queue()
        for f in futs:
            f.add_done_callback(ready.put)
        nxt, gone_since, idle_since, no_device_since = 0, None, time.monotonic(), None
        try:
            while nxt < len(futs):
                while nxt in done:
                    yield done.pop(nxt)
                    nxt += 1
                if nxt >= len(futs):
                    break
                try:
                    f = ready.get(timeout=1.0)
                except queue.Empty:
                    f = None
                if self.client.status == "running":
                    gone_since = None
                else:  # reconnecting, or closed: give it lost_after_s
                    gone_since = gone_since or time.monotonic()
                    if time.monotonic() - gone_since > self.lost_after_s:
                        raise SchedulerLostError(self._lost_message(nxt + len(done), len(futs)))  # (done: stranded)
                    if f is not None:
                        ready.put(f)  # look again once the scheduler is back
                        time.sleep(0.2)
                    continue
                if f is None:  # nothing finished for a while: is there still a device to measure on?
                    if time.monotonic() - idle_since > min(5.0, self.no_device_s / 2):
                        idle_since = time.monotonic()
                        if self._devices() > 0:
                            no_device_since = None
                        else:
                            no_device_since = no_device_since or time.monotonic()
                            if time.monotonic() - no_device_since > self.no_device_s:
                                raise NoDeviceError(self._no_device_message(len(futs) - nxt))
                    continue
                idle_since = time.monotonic()
                i = index.get(f.key)
                if i is None or i in done or f is not futs[i]:
                    continue
                res = self._outcome(f)
                if isinstance(res, MeasureResult):
                    done[i] = res
                else:  # its worker died (or its data was lost)
                    pending = [j for j in range(nxt, len(futs)) if j not in done]
                    death = _killed_on(f)
                    if death is not None:  # Dask fails every task queued on a dead worker: charge the one it ran
                        if death not in charged:
                            charged[death] = self._running_key(death, [(futs[j], prio[j]) for j in pending])
                        running = charged[death] == f.key
                    elif res == "cancelled":  # its input arrays were lost with the workers holding them: never
                        # ran, unless it keeps coming back so (a kernel killing a worker Dask then releases it
                        # from, with allowed-failures > 0): charged from the third time on, never re-queued forever
                        cancels[i] += 1
                        running = cancels[i] > CANCELS_FREE
                    else:  # a lost result: the first unfinished candidates (one per device)
                        running = i in pending[:max(1, self._device_peak)]
                    if running and tries[i] >= self.requeue:
                        done[i] = MeasureResult("runtime_error", error=f"the measuring worker died or was lost "
                                                f"{tries[i] + 1} times while measuring it ({res})")
                        continue
                    tries[i] += running
                    self.requeued += 1
                    b = builds[i] if self._alive(builds[i]) else self._builds([sources[i]], self.build_mode())[0]
                    prio[i] = 2 * n - i
                    futs[i] = self._guard(self._submit, sources[i], requests[i], b, prio[i])
                    index[futs[i].key] = i
                    futs[i].add_done_callback(ready.put)
        finally:
            self._stranded = sorted(done.items())
            rest = [f for i, f in enumerate(futs) if i >= nxt and not f.done()]
            if rest and self.client.status == "running":
                try:
                    self.client.cancel(rest)
                except Exception:  # noqa: BLE001 - best effort
                    pass

    def _running_key(self, death: tuple, candidates: list[tuple[Any, int]]) -> Any:
        """The key of the task the dead worker ``death`` was running, among ``candidates`` (future, priority):
        the one whose start event names that worker, else the highest priority of those it was given."""
        time.sleep(DEATH_GRACE_S)  # the scheduler fails a dead worker's tasks at once: let every report arrive
        on = [(f, p) for f, p in candidates if f.status == "error" and _killed_on(f) == death]
        if not on:
            return None
        try:
            events = self.client.get_events(START_TOPIC)
        except Exception:  # noqa: BLE001 - no events: the priorities decide
            events = ()
        started = {m.get("key") for _, m in events if isinstance(m, dict) and m.get("worker") == death[0]
                   and m.get("id") in (None, death[1])}
        ran = [f.key for f, _ in on if f.key in started]
        return ran[0] if ran else max(on, key=lambda fp: fp[1])[0].key

    @staticmethod
    def _alive(build: Any) -> bool:
        return build is None or isinstance(build, remote.Shipped) or build.status in ("pending", "finished")

    def _outcome(self, f: Any) -> MeasureResult | str:
        """A finished future's MeasureResult, or why it has none ("cancelled", the error's text)."""
        if f.status == "finished":
            try:
                return f.result()
            except Exception as e:  # noqa: BLE001 - fetching failed: the worker holding it died
                return f"result lost: {type(e).__name__}: {e}"
        if f.status == "cancelled":
            return "cancelled"
        try:
            exc = f.exception()
        except Exception as e:  # noqa: BLE001
            exc = e
        if isinstance(exc, CacheWriteError):  # a worker's disk, not the candidate nor a lost worker: the run stops
            raise exc
        return f"{type(exc).__name__}: {exc}"

    def _lost_message(self, measured: int, total: int) -> str:
        return (f"lost the Dask scheduler {_address(self.client)}: no answer for "
                f"{self.lost_after_s:g} s; {measured} of this batch's {total} candidates were measured and "
                f"are in the database. Start the scheduler and its workers again (they stop with it) and rerun "
                f"the same command to resume the run.")

    # ---- the Runner protocol -------------------------------------------------------------------------
    def build(self, sources: Sequence[str]) -> list[BuildResult]:
        """Build every source where builds go (``"device"``: when it is measured; the result is a promise)."""
        out = []
        for src, b in zip(sources, self._guard(self._builds, list(sources), self.build_mode())):
            if b is None:  # built by the measuring worker, right before measuring it
                key = "device:" + hashlib.sha256(src.encode()).hexdigest()
                self._device_sources[key] = src
                out.append(BuildResult("ok", None, "", 0.0, False, key))
                continue
            shipped = b if isinstance(b, remote.Shipped) else self._guard(b.result)
            self._shipped[shipped.result.key] = shipped
            out.append(shipped.result)
        return out

    def run(self, request: RunRequest, *, build: BuildResult | None = None) -> MeasureResult:
        """Measure one request against a build from :meth:`build` (without one, ``request.lib_path``
        names a library file on the measuring worker)."""
        if build is not None and build.status != "ok":
            return MeasureResult("timeout" if build.status == "timeout" else "compile_error", error=build.error)
        source, shipped = None, None
        if build is None:
            shipped = remote.Shipped(BuildResult("ok", request.lib_path, "", 0.0, False, ""))
        elif build.key in self._device_sources:
            source = self._device_sources[build.key]
        elif build.key in self._shipped:
            shipped = self._shipped[build.key]
        else:
            raise ValueError("run(build=...) takes a build made by this runner's build()")
        return next(self._stream([source], [request], [shipped]))

    def close(self) -> None:
        """Forget scattered data and builds (the client and the cluster belong to the caller)."""
        self._scattered.clear()
        self._shipped.clear()
        self._device_sources.clear()


def _killed_on(f: Any) -> tuple[str, Any] | None:
    """(address, id) of the worker whose death failed the future ``f`` (Dask's ``KilledWorker``), else None."""
    if f.status != "error":
        return None
    try:
        exc = f.exception()
    except Exception as e:  # noqa: BLE001
        exc = e
    worker = getattr(exc, "last_worker", None)
    if type(exc).__name__ != "KilledWorker" or not getattr(worker, "address", None):
        return None
    return worker.address, getattr(worker, "server_id", None)


def _read(b: BuildResult) -> bytes | None:
    if b.status != "ok" or not b.lib_path:
        return None
    with open(b.lib_path, "rb") as f:
        return f.read()


def local_cluster(*, build_workers: int = 1, pin: bool | None = None, allowed_failures: int = 0, **kwargs: Any):
    """A :class:`distributed.LocalCluster` of worker *processes* laid out for tuning: one measuring
    worker (one thread, ``device=1``) and ``build_workers`` build workers (one thread each,
    ``build=1``). ``allowed_failures`` (0) is the scheduler's: a task whose worker dies is reported
    at once, and :class:`DaskRunner` re-queues it once. ``pin`` (default: on hosts with ≤ 4 cores)
    is a hint returned with the cluster as ``cluster.felixjax_cpus = (measure_cpus, build_cpus)``:
    CPU 0 for measuring, the others for builds — pass them to :class:`DaskRunner`.

    Call it under ``if __name__ == "__main__":`` in scripts (workers are spawned processes).
    """
    import os

    _need_distributed("local_cluster()")
    import dask
    from distributed import LocalCluster

    from distributed.deploy.cluster import Cluster

    class TuningCluster(LocalCluster):
        def _update_worker_status(self, op, msg):
            # a SpecCluster drops a worker that stays away from the scheduler for lost-worker-timeout,
            # even while its nanny is restarting it (a measuring worker dying again and again): keep it
            Cluster._update_worker_status(self, op, msg)

    with dask.config.set({"distributed.scheduler.allowed-failures": int(allowed_failures)}):
        cluster = TuningCluster(n_workers=0, threads_per_worker=1, processes=True, dashboard_address=None,
                                **kwargs)
    base = cluster.new_spec
    spec = {}
    for name, res in [("measure-0", {"device": 1})] + [(f"build-{i}", {"build": 1}) for i in range(build_workers)]:
        w = copy.deepcopy(base)
        w["options"] = dict(base["options"], resources=res, name=name)
        spec[name] = w
    cluster.worker_spec.update(spec)
    cluster.sync(cluster._correct_state)
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(ncpu))
    pin = (ncpu <= 4) if pin is None else pin
    cluster.felixjax_cpus = ((cpus[0],), tuple(cpus[1:]) or (cpus[0],)) if pin and ncpu > 1 else (None, None)
    return cluster


def _address(client: Any) -> str:
    return str(getattr(getattr(client, "scheduler", None), "address", "") or "")


def _probe(spec: str) -> None:
    """A refused connection or an unknown host at a ``tcp://host:port`` address is a
    :class:`SchedulerLostError` at once (Dask's client retries those until its timeout, 30 s); anything
    else (a slow network, another protocol) is left to the client."""
    url = urllib.parse.urlsplit(spec)
    if url.scheme != "tcp" or not url.hostname:
        return
    try:
        port = url.port
    except ValueError:
        raise SchedulerLostError(f"cannot reach the Dask scheduler at {spec}: the port is not a number in "
                                 f"0-65535") from None
    if port is None:
        return
    try:
        socket.create_connection((url.hostname, port), timeout=5).close()
    except (ConnectionRefusedError, socket.gaierror) as e:
        raise SchedulerLostError(f"cannot reach the Dask scheduler at {spec}: {e}") from None
    except OSError:  # a timeout or an unreachable network: the client's own timeout decides
        return


def _need_distributed(what: str) -> None:
    """An ``ImportError`` naming the extra to install where dask.distributed is missing."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise ImportError(f"{what} needs dask.distributed: pip install 'felixjax[dask]'") from None


@contextlib.contextmanager
def connect(spec: str, *, timeout_s: float = 30.0, **runner_kwargs: Any) -> Iterator[DaskRunner]:
    """A :class:`DaskRunner` for ``--dask SPEC``: ``"local"`` starts a :func:`local_cluster` (closed on
    exit; measuring and builds pinned apart on hosts with ≤ 4 cores), an address (``tcp://host:8786``)
    connects to a running scheduler (left running)."""
    _need_distributed("--dask / connect()")
    from distributed import Client

    cluster = None
    if spec == "local":
        cluster = local_cluster()
        measure_cpus, build_cpus = cluster.felixjax_cpus
        runner_kwargs = {"measure_cpus": measure_cpus, "build_cpus": build_cpus, **runner_kwargs}
        client = Client(cluster)
    else:
        if "://" not in spec and ":" not in spec:  # session 80: "loca" said "missing port number in address"
            raise SchedulerLostError(f"--dask / connect() take 'local' or a scheduler address such as "
                                     f"tcp://host:8786 (got {spec!r})")
        try:
            _probe(spec if "://" in spec else f"tcp://{spec}")  # (Dask reads host:port as tcp)
            client = Client(spec, timeout=f"{timeout_s}s")
        except OSError as e:
            raise SchedulerLostError(f"cannot reach the Dask scheduler at {spec}: {e}") from None
        except (TypeError, ValueError) as e:  # "127.0.0.1:" (no port), "tls://" without a security config
            raise SchedulerLostError(f"cannot connect to the Dask scheduler at {spec!r} ({type(e).__name__}: {e}); "
                                     f"--dask / connect() take 'local' or an address such as tcp://host:8786") from None
    try:
        yield DaskRunner(client, **runner_kwargs)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
