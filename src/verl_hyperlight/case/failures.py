"""Backend failures, as this process counts and logs them: once per cause at ERROR, then
counted, with a reminder at every power of ten, so a long run keeps saying it is broken; and
a bug of this package's, its traceback once per cause. serve's metrics read the counts."""

from __future__ import annotations

import logging
import traceback

from ..errors import ZEROES_REWARDS, BackendError, CauseCounts, worth_logging

logger = logging.getLogger("verl_hyperlight")


class FailureLog(CauseCounts):
    """Backend failures: logged at ERROR once per cause per process, then counted, with a
    reminder at every power of ten so a long run keeps saying it is broken."""

    PERSISTENT = ZEROES_REWARDS
    ONE_OFF = "the case is answered SandboxError, scored as a sandbox error; later cases run"

    def record(
        self, cause: str, message: str, consequence: str, error: BaseException | None = None
    ) -> None:
        """Count one more case failed by `cause`; log it the first time (with `error`'s
        traceback, if given), and at every power of ten."""
        count = self.count(cause)
        if count == 1:
            logger.error("verl-hyperlight: %s (%s)", message, consequence, exc_info=error)
        elif worth_logging(count):
            logger.error("verl-hyperlight: %d cases failed so far with: %s", count, message)

    def internal(self, error: Exception) -> None:
        """A bug of this package's: its traceback logged once per cause (the exception's type
        and the line that raised it), as a backend failure is, not once per case."""
        where = traceback.extract_tb(error.__traceback__)[-1:]
        place = f" at {where[0].filename}:{where[0].lineno}" if where else ""
        self.record(
            f"internal {type(error).__qualname__}{place}",
            f"internal error {error!r}{place}",
            f"{self.ONE_OFF}; later cases that fail the same way are counted, not logged",
            error,
        )

    def backend(self, failure: BackendError) -> None:
        if failure.announced:  # logged where it arose (a guest's gate opening)
            self.count(failure.cause)
            return
        consequence = self.PERSISTENT if failure.persistent else self.ONE_OFF
        self.record(failure.cause, str(failure), consequence)


# This process's backend failures (one log per process: a cause is said once in it).
log = FailureLog()
