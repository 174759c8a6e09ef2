"""The package's exceptions. None of them reaches verl: run_code turns each into a value."""


class HyperlightError(Exception):
    """Base of the errors verl-hyperlight raises internally."""


class InvalidRequest(HyperlightError):
    """The request cannot be run as given (a bad URL, argument type or limit)."""


class BackendError(HyperlightError):
    """hluk or the micro-VM failed; the message says what an operator should do."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause
