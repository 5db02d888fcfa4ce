"""The engine's few named exceptions; the UI/CLI edge turns them into user messages."""


class DFlashError(Exception):
    """Base class: every error the engine raises on purpose."""


class CheckpointError(DFlashError):
    """A checkpoint is missing, unreadable, pickle-only, or malformed."""


class UnsupportedTargetError(CheckpointError):
    """A target whose cache the decode loop cannot roll back after a rejected draft."""


class UnsupportedQuantizationError(CheckpointError):
    """A target stored in a quantized format that cannot load on this device."""


class IncompatibleDraftError(DFlashError):
    """The draft does not fit the target (hidden size, vocabulary, layer ids, mask row)."""


class InvalidRequestError(DFlashError):
    """A generation parameter or prompt is out of range."""


class EngineUnavailableError(DFlashError):
    """An engine behind HTTP (a vLLM server) is missing, failed to start, or stopped answering."""


# One wording per rule, shared by the UI, the CLI and the HTTP API.
EMPTY_PROMPT = "the prompt is empty: write something for the model to answer"
CONTEXT_FULL = "the context window is full"


class EmptyPromptError(InvalidRequestError):
    """The prompt has no text other than white space."""

    def __init__(self, message: str = EMPTY_PROMPT):
        super().__init__(message)


class PromptTooLongError(InvalidRequestError):
    """The prompt leaves no room in the context window; each edge adds its own advice."""

    def __init__(self, prompt_tokens: int, context_window: int):
        self.prompt_tokens, self.context_window = prompt_tokens, context_window
        super().__init__(f"the prompt is {prompt_tokens} tokens; this model's context window is "
                         f"{context_window} tokens")


def check_prompt_text(text) -> str:
    """The one empty-prompt rule: ``None``, "" and white space only are refused (``EMPTY_PROMPT``)."""
    if text is None or not str(text).strip():
        raise EmptyPromptError()
    return str(text)


class NonFiniteLogitsError(DFlashError):
    """The model's logits held NaN or inf (bad weights, or an fp16/bf16 overflow)."""


class MissingExtraError(DFlashError):
    """A feature needs a package that an optional extra of the project installs (``engine.extras``)."""
