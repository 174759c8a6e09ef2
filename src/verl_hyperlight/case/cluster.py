"""Ray, for ``hyperlight://?ray`` (``?ray=NAME``): the one module that imports it and spells
its options. Work is placed on the nodes of the cluster that offer the URL's custom resource
(``hyperlight`` by default), one unit each and no CPU: a case as a task (`run`), a notebook as
an actor that holds its unit for its life (`Actor`), doctor's checks as a task pinned to each
such node (`run_on_each`).

A case is a task, not an actor call: a task's demand for the resource is what Ray's autoscaler
sees and adds nodes for, and Ray reuses a node's worker processes across tasks, so the warm
guest and the gate of a worker process on that node serve its later cases with no warm-up of
their own. The caller names the function the node runs (``run_code``, with the URL less
``ray``), so that what runs there is exactly what ``hyperlight://`` runs, and this module
imports nothing of the case path above it. ``max_retries=0``: Ray runs a task once more
elsewhere when its node died before it started, and never a started one twice (a started case
whose node died is answered SandboxError saying so, not run again behind the caller's back).

The demand stays visible: every case is submitted, and while no alive node offers the
resource it stays pending in Ray, where the autoscaler sees it (``ray status``: Pending
Demands) and can start a node of a KVM group, from zero; it is answered as soon as a node
joins, and SandboxError (naming the resource and the ``ray start`` that offers it) once it has
waited ``VERL_HYPERLIGHT_RAY_WAIT`` with none, its task cancelled then, as on every way out.
A notebook's actor is placed within the start-up deadline while nodes offer the resource (all
of its units held by others: a capacity answer, the actor withdrawn), or within the same wait
while none does: no caller waits for a unit without a deadline.

Ray is imported only when such a URL is used: the plugin verl imports in every process does
not load it.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

from .. import cancel as cancels
from .. import diagnosis, settings
from ..errors import CauseCounts, Refused

logger = logging.getLogger("verl_hyperlight")

# How long a check that the resource is offered is taken as still true (a case costs no
# round trip to Ray's control store while the cluster is as it was), and how often a waiting
# case looks again.
PRESENCE_SECONDS = 1.0
# How long an actor's running call is given to end (its `cancel_method` called) before the
# actor is killed.
ACTOR_END_SECONDS = 10.0


@dataclass(frozen=True)
class Node:
    """An alive node of the cluster that offers a resource."""

    node_id: str
    address: str
    units: float  # of the resource it offers

    @property
    def label(self) -> str:
        return f"{self.address} {self.node_id[:8]}"


def _placement(resource: str, node_id: str | None = None) -> dict[str, Any]:
    """Ray's options for work that holds one unit of `resource` and no CPU (on the node
    `node_id`, when given): every task and actor of this package is placed so."""
    options: dict[str, Any] = {"resources": {resource: 1}, "num_cpus": 0}
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return options


def _answers(address: str) -> None:
    """OSError unless something listens at `address` (HOST:PORT), seen within the start-up
    deadline: ray.init retries an address that does not answer for minutes."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        return  # "auto", or a form only Ray reads: Ray says
    with socket.create_connection(
        (host.strip("[]"), int(port)), timeout=settings.STARTUP_TIMEOUT.value()
    ):
        pass


class _Connection:
    """This process's view of the cluster: its connection, its remote functions and actor
    classes, and which resources an alive node offers (looked at once per PRESENCE_SECONDS,
    for every case of the process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ray: Any = None
        self._remote: dict[tuple[object, str], Any] = {}  # (function, resource): its task
        self._classes: dict[type, Any] = {}
        self._seen: dict[str, tuple[float, bool]] = {}  # resource: (checked at, offered)
        self._looking: dict[str, threading.Lock] = {}  # resource: held while one looks
        self._awaited = CauseCounts()  # resources cases waited for a node of: said once each

    def ray(self, resource: str | None = None) -> Any:
        """Ray, imported and connected; BackendError when it cannot be (said for cases that
        need `resource`, when the caller has one)."""
        if self._ray is not None:
            return self._ray
        with self._lock:
            if self._ray is None:
                try:
                    import ray
                except ImportError as exc:
                    raise diagnosis.ray_missing(str(exc)) from None
                if not ray.is_initialized():
                    # A cluster to join, never one of our own: "auto" is the one `ray start`
                    # runs on this node, RAY_ADDRESS the one named.
                    address = settings.RAY_ADDRESS.value() or "auto"
                    try:
                        _answers(address)
                        ray.init(address=address)
                    except (ConnectionError, RuntimeError, ValueError, OSError) as exc:
                        raise diagnosis.ray_unreachable(f"{address}: {exc}", resource) from None
                self._ray = ray
        return self._ray

    def task(self, function: Callable[..., Any], resource: str) -> Any:
        """The remote function that runs `function` on a node offering `resource`."""
        key = (function, resource)
        task = self._remote.get(key)
        if task is None:
            task = self._remote[key] = (
                self.ray(resource)
                .remote(function)
                .options(**_placement(resource), max_retries=0, name="verl-hyperlight case")
            )
        return task

    def actor_class(self, cls: type) -> Any:
        """`cls` as a Ray actor class, made once per process."""
        made = self._classes.get(cls)
        if made is None:
            made = self._classes[cls] = self.ray().remote(cls)
        return made

    def offered(self, resource: str, now: float) -> bool:
        """Whether an alive node of the cluster offers `resource`, as last seen within
        PRESENCE_SECONDS: one look at Ray's control store per resource and process at a time
        and per PRESENCE_SECONDS, however many cases wait (the others take its answer)."""
        seen = self._seen.get(resource)
        if seen is not None and now - seen[0] < PRESENCE_SECONDS:
            return seen[1]
        with self._looking.setdefault(resource, threading.Lock()):
            seen = self._seen.get(resource)
            if seen is not None and now - seen[0] < PRESENCE_SECONDS:
                return seen[1]  # looked at while this case waited for the lock
            offered = self.units(resource) > 0
            self._seen[resource] = (now, offered)
        return offered

    def units(self, resource: str) -> float:
        """How many units of `resource` the alive nodes offer in all, now."""
        return float(self.ray(resource).cluster_resources().get(resource, 0))

    def _look(
        self,
        resource: str,
        now: float,
        began: float,
        unoffered_since: float | None,
        limit: float,
        placed_within: float | None,
    ) -> float | None:
        """A waiting case's look at whether a node offers `resource`: since when none has
        (None: one does); BackendError when none has for `limit` seconds, or when one does but
        the wait has gone on past `placed_within`."""
        if self.offered(resource, now):
            if placed_within is not None and now - began >= placed_within:
                raise self._not_placed(resource, placed_within)
            return None
        if unoffered_since is None:
            unoffered_since = now
            if self._awaited.first(resource):
                logger.warning(
                    "verl-hyperlight: %s", diagnosis.ray_awaiting_a_node(resource, limit)
                )
        if now - unoffered_since >= limit:
            raise diagnosis.ray_resource_offered_by_none(resource, limit)
        return unoffered_since

    def _not_placed(self, resource: str, seconds: float) -> BaseException:
        """Why an actor offered `resource` was not up within `seconds`: every unit held, or
        (some free) its Ray worker slow to start."""
        ray = self.ray(resource)
        units = self.units(resource)
        try:
            free = float(ray.available_resources().get(resource, 0))
        except Exception:  # the usual answer, when Ray cannot say
            free = 0
        if free >= 1:
            return diagnosis.ray_actor_slow(resource, free, units, seconds)
        return diagnosis.ray_units_held(resource, units, seconds)

    def wait(
        self,
        reference: Any,
        resource: str,
        cancel: threading.Event | None,
        cancelled: str,
        stop: Callable[[], None],
        placed_within: float | None = None,
    ) -> Any:
        """What `reference` (a task's or an actor call's, needing `resource`) comes to; on the
        caller's cancel (Refused with `cancelled`), on no node offering `resource` for
        VERL_HYPERLIGHT_RAY_WAIT (BackendError), or on any other way out, `stop` is called
        first. With `placed_within`, it must also come within that many seconds while nodes
        offer the resource (an actor waiting for a unit others hold: BackendError).

        The waiting thread sleeps until the answer comes (Ray completes the reference's
        future), the cancel wakes it (a `Cancel`), or its next look at the resource's presence
        is due, every PRESENCE_SECONDS: it never wakes only to look at its cancel, unless that
        is a plain Event (looked at every cancel.POLL_SECONDS)."""
        ray = self.ray(resource)
        limit = settings.RAY_WAIT.value()
        began = time.monotonic()
        unoffered_since: float | None = None
        answered = reference.future()
        woken: futures.Future[None] = futures.Future()

        def wake() -> None:  # run under the cancel's lock, one set at a time
            if not woken.done():
                woken.set_result(None)

        try:
            with cancels.on_set(cancel, wake) as wakes:
                look_at = began  # the next look at the resource's presence
                while True:
                    if cancel is not None and cancel.is_set():
                        raise Refused(cancelled)
                    now = time.monotonic()
                    if now >= look_at:
                        unoffered_since = self._look(
                            resource, now, began, unoffered_since, limit, placed_within
                        )
                        look_at = now + PRESENCE_SECONDS
                        if unoffered_since is not None:
                            look_at = min(look_at, unoffered_since + limit)
                        elif placed_within is not None:
                            look_at = min(look_at, began + placed_within)
                    futures.wait(
                        [answered, woken],
                        timeout=cancels.longest_sleep(cancel, wakes, max(0.0, look_at - now)),
                        return_when=futures.FIRST_COMPLETED,
                    )
                    if answered.done():
                        # Ready: ray.get gives it (pulled from its node when large), or says
                        # why Ray failed it.
                        return _result(ray, reference, None)
        except BaseException:
            stop()
            raise


def _result(ray: Any, reference: Any, timeout: float | None) -> Any:
    """The task's answer, once it has one within `timeout` (else GetTimeoutError); a
    BackendError saying why when Ray failed it."""
    lost = (
        ray.exceptions.ActorDiedError,
        ray.exceptions.NodeDiedError,
        ray.exceptions.WorkerCrashedError,
        ray.exceptions.ObjectLostError,
        ray.exceptions.OwnerDiedError,
    )
    try:
        return ray.get(reference, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise  # not yet
    except lost as exc:
        raise diagnosis.ray_node_lost(exc) from None
    except ray.exceptions.RayError as exc:
        raise diagnosis.ray_failed(exc) from None


# The one piece of this module's state: this process's connection to the cluster.
_connection = _Connection()


def run(
    resource: str,
    function: Callable[..., Any],
    arguments: tuple[Any, ...],
    options: dict[str, Any],
    cancel: threading.Event | None,
    cancelled: str,
) -> Any:
    """``function(*arguments, **options)`` as a task on a node that offers `resource`;
    BackendError when none does or Ray fails it, Refused with `cancelled` when the caller
    cancelled it."""
    ray = _connection.ray(resource)
    reference = _connection.task(function, resource).remote(*arguments, **options)
    # Killed where it runs (its worker process, and with it the micro-VM's hluk), or taken
    # off the queue.
    stop: Callable[[], None] = lambda: ray.cancel(reference, force=True)  # noqa: E731
    return _connection.wait(reference, resource, cancel, cancelled, stop)


def units(resource: str) -> float:
    """How many units of `resource` the cluster's alive nodes offer in all now; BackendError
    when the cluster cannot be reached."""
    return _connection.units(resource)


def nodes_offering(resource: str) -> list[Node]:
    """The alive nodes of the cluster that offer `resource`; BackendError when the cluster
    cannot be reached."""
    return [
        Node(node["NodeID"], node["NodeManagerAddress"], node["Resources"][resource])
        for node in _connection.ray(resource).nodes()
        if node["Alive"] and node["Resources"].get(resource, 0) > 0
    ]


def run_on_each(
    resource: str,
    nodes: list[Node],
    function: Callable[..., Any],
    arguments: tuple[Any, ...],
    timeout: float,
) -> Iterator[tuple[Node, Any]]:
    """``function(*arguments)`` on each of `nodes` (a task pinned there, holding a unit of
    `resource`), all at once; each node with its answer, in order, or with the exception that
    stood for it (its node died, it ran past `timeout`, Ray failed it)."""
    ray = _connection.ray(resource)
    task = ray.remote(function)
    pending = [
        (node, task.options(**_placement(resource, node.node_id), max_retries=0).remote(*arguments))
        for node in nodes
    ]
    for node, reference in pending:
        try:
            yield node, ray.get(reference, timeout=timeout)
        except Exception as exc:  # reported as that node's
            yield node, exc


class Actor:
    """An instance of `cls` in an actor on a node that offers `resource`, holding one unit of
    it for its whole life; its calls run two at a time (one may end the other)."""

    def __init__(self, cls: type, resource: str, *arguments: Any) -> None:
        self.resource = resource
        placed = _connection.actor_class(cls).options(
            **_placement(resource), max_restarts=0, max_concurrency=2
        )
        self.handle = placed.remote(*arguments)

    def call(
        self,
        method: str,
        arguments: tuple[Any, ...],
        cancel: threading.Event | None,
        cancelled: str,
        stop: Callable[[Any], None],
        placed_within: float | None = None,
    ) -> Any:
        """What ``method(*arguments)`` answers, waited for as `run` waits for a case (with
        `placed_within`, the actor's first call: held to that while nodes offer the resource);
        `stop(call)` is called first on any way out but the answer."""
        call = getattr(self.handle, method).remote(*arguments)
        return _connection.wait(
            call, self.resource, cancel, cancelled, lambda: stop(call), placed_within
        )

    def end(self, running: Any = None, cancel_method: str | None = None) -> None:
        """Kill the actor; with a `running` call, `cancel_method` is called first and the call
        given ACTOR_END_SECONDS to end, so that what it runs is ended by its own cancel rather
        than by its process's death alone."""
        ray = _connection.ray()
        try:
            if running is not None and cancel_method is not None:
                getattr(self.handle, cancel_method).remote()
                ray.wait([running], timeout=ACTOR_END_SECONDS)
        except Exception:  # the kill below ends it whatever happened here
            pass
        finally:
            ray.kill(self.handle, no_restart=True)
