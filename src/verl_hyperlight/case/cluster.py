"""Cases across a Ray cluster (``hyperlight://?ray``, ``?ray=NAME``): each case is a Ray task
that needs one unit of the URL's custom resource (``hyperlight`` by default) and no CPU, and
runs ``api.run_code`` on the node Ray puts it on, with the URL less ``ray``: exactly as
``hyperlight://`` runs it there (its warm guest, its gate, its deadlines), its answer brought
back as it was made.

Ray does the placing, the queueing and the retrying. A task, not an actor call: a task's demand
for the resource is what Ray's autoscaler sees and adds nodes for, and Ray reuses a node's
worker processes across tasks, so the warm guest and the gate of a worker process on that node
serve its later cases with no warm-up of their own. ``max_retries=0``: Ray runs a task once
more elsewhere when its node died before it started, and never a started one twice (a started
case whose node died is answered SandboxError saying so, not run again behind the caller's
back). Waiting on it, the caller checks that some alive node still offers the resource: when
none has for the start-up deadline the case is answered SandboxError naming the resource and
the ``ray start`` that offers it, and later cases are answered at once while none does.

Ray is imported here only, and only when such a URL is used: the plugin verl imports in every
process does not load it.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import diagnosis, settings
from ..errors import Refused

logger = logging.getLogger("verl_hyperlight")

# How long a check that the resource is offered is taken as still true: a case costs no
# round trip to Ray's control store while the cluster is as it was.
PRESENCE_SECONDS = 1.0
# How often a waiting case looks at its cancel event and at the resource's presence.
POLL_SECONDS = 0.1

Response = dict[str, Any]


def _on_node(arguments: tuple[Any, ...], options: dict[str, Any]) -> Any:
    """A case on the node Ray chose: `api.run_code` as ``hyperlight://`` runs it there."""
    from . import api

    return api.run_code(*arguments, **options)


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


class _Cluster:
    """This process's view of the cluster: its connection, its tasks by resource, and which
    resources an alive node offers (checked at most every PRESENCE_SECONDS while offered)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ray: Any = None
        self._tasks: dict[str, Any] = {}
        self._seen: dict[str, tuple[float, bool]] = {}  # resource: (checked at, offered)
        self._missing: set[str] = set()  # resources a case failed for want of: fail fast

    def ray(self) -> Any:
        """Ray, imported and connected; BackendError when it cannot be."""
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
                        raise diagnosis.ray_unreachable(f"{address}: {exc}") from None
                self._ray = ray
        return self._ray

    def task(self, resource: str) -> Any:
        """The remote function that runs a case on a node offering `resource`."""
        task = self._tasks.get(resource)
        if task is None:
            ray = self.ray()
            task = ray.remote(_on_node).options(
                resources={resource: 1},
                num_cpus=0,
                max_retries=0,
                name="verl-hyperlight case",
            )
            self._tasks[resource] = task
        return task

    def offered(self, resource: str, now: float) -> bool:
        """Whether an alive node of the cluster offers `resource` (as last seen within
        PRESENCE_SECONDS when it did)."""
        checked, offered = self._seen.get(resource, (-1.0, False))
        if offered and now - checked < PRESENCE_SECONDS:
            return True
        offered = bool(self.ray().cluster_resources().get(resource, 0) > 0)
        self._seen[resource] = (now, offered)
        if offered and resource in self._missing:
            self._missing.discard(resource)
            logger.warning(
                "verl-hyperlight: a node of the Ray cluster offers %r again: its cases run",
                resource,
            )
        return offered

    def run(
        self,
        resource: str,
        arguments: tuple[Any, ...],
        options: dict[str, Any],
        cancel: threading.Event | None,
        cancelled: str,
    ) -> tuple[Response | None, str | None]:
        """``api.run_code(*arguments, **options)`` on a node that offers `resource`;
        BackendError when none does or Ray fails it, Refused with `cancelled` when the caller
        cancelled it."""
        ray = self.ray()
        self.fail_fast(resource)
        reference = self.task(resource).remote(arguments, options)
        # Killed where it runs (its worker process, and with it the micro-VM's hluk), or taken
        # off the queue.
        stop: Callable[[], None] = lambda: ray.cancel(reference, force=True)  # noqa: E731
        answer: tuple[Response | None, str | None] = self.wait(
            reference, resource, cancel, cancelled, stop
        )
        return answer

    def fail_fast(self, resource: str) -> None:
        """BackendError at once when a case failed for want of `resource` and no node offers
        it still."""
        if resource in self._missing and not self.offered(resource, time.monotonic()):
            startup = settings.STARTUP_TIMEOUT.value()
            raise diagnosis.ray_resource_offered_by_none(resource, startup)

    def wait(
        self,
        reference: Any,
        resource: str,
        cancel: threading.Event | None,
        cancelled: str,
        stop: Callable[[], None],
    ) -> Any:
        """What `reference` (a task's or an actor call's, needing `resource`) comes to; on the
        caller's cancel (Refused with `cancelled`), on no node offering `resource` for the
        start-up deadline (BackendError), or on any other way out, `stop` is called first."""
        ray = self.ray()
        startup = settings.STARTUP_TIMEOUT.value()
        unoffered_since: float | None = None
        try:
            while True:
                try:
                    return self._result(ray, reference, POLL_SECONDS)
                except ray.exceptions.GetTimeoutError:
                    pass
                if cancel is not None and cancel.is_set():
                    raise Refused(cancelled)
                now = time.monotonic()
                if self.offered(resource, now):
                    unoffered_since = None
                    continue
                unoffered_since = now if unoffered_since is None else unoffered_since
                if now - unoffered_since >= startup:
                    self._missing.add(resource)
                    raise diagnosis.ray_resource_offered_by_none(resource, startup)
        except BaseException:
            stop()
            raise

    @staticmethod
    def _result(ray: Any, reference: Any, timeout: float) -> Any:
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


cluster = _Cluster()
