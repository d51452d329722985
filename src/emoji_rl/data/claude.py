"""What the `prompts` and `teacher` stages share about the Anthropic API: the key check, the client, and
which errors are worth retrying.

The SDK reads the key from the environment itself; this module only checks that it is there, so the
key never passes through our code, logs, state files or outputs. Transient failures (429, 529, 5xx,
connection errors) are retried by the SDK with exponential backoff and jitter, honouring
`retry-after`; `max_retries` sets how many times.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from emoji_rl.errors import UserError

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import Message

KEY_ENV = "ANTHROPIC_API_KEY"
DEFAULT_MODEL = "claude-sonnet-5-5"


def require_key(what: str, offline_command: str) -> None:
    """Fail before any work when the key is missing, naming the variable and the offline way."""
    if not os.environ.get(KEY_ENV):
        raise UserError(
            f"{what} calls the Anthropic API and needs the environment variable {KEY_ENV}, which is not set. "
            f"Export your key as {KEY_ENV}, or run offline: `{offline_command}`"
        )


def make_client(max_retries: int) -> anthropic.Anthropic:
    import anthropic

    return anthropic.Anthropic(max_retries=max_retries)


def is_transient(err: Exception) -> bool:
    """Worth trying again later: rate limits, overload (529), server errors, lost connections.
    Anything else (bad request, auth, not found) fails the same way every time."""
    import anthropic

    if isinstance(err, anthropic.APIStatusError):
        return err.status_code in (408, 409, 429) or err.status_code >= 500
    return isinstance(err, anthropic.APIConnectionError)


def describe(err: Exception) -> str:
    """A one-line description of an API error for logs and reject files (never holds the key)."""
    import anthropic

    if isinstance(err, anthropic.APIStatusError):
        return f"HTTP {err.status_code} {type(err).__name__}: {err.message}"
    return f"{type(err).__name__}: {err}"


def fatal(err: Exception, what: str) -> UserError:
    """The error to raise for a failure that retrying will not fix."""
    return UserError(f"{what} failed: {describe(err)}; check the model name, the key and the request")


def message_text(message: Message) -> str:
    """The concatenated text blocks of a reply."""
    return "".join(block.text for block in message.content if block.type == "text")
