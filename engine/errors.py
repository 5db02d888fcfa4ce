"""The engine's few named exceptions; the UI/CLI edge turns them into user messages."""


class DFlashError(Exception):
    """Base class: every error the engine raises on purpose."""


class CheckpointError(DFlashError):
    """A checkpoint is missing, unreadable, pickle-only, or malformed."""


class IncompatibleDraftError(DFlashError):
    """The draft does not fit the target (hidden size, vocabulary, layer ids, mask row)."""


class InvalidRequestError(DFlashError):
    """A generation parameter or prompt is out of range."""


class EngineUnavailableError(DFlashError):
    """An engine behind HTTP (a vLLM server) is missing, failed to start, or stopped answering."""
