"""The one exception type users see: a one-line message that says what is wrong and what to do."""


class LongswiftError(Exception):
    """A user-facing error; the CLI prints its message on one line and exits with status 2."""


class ConfigError(LongswiftError, ValueError):
    """A bad config value. The message names the field as the Python API spells it
    (`SamplingConfig.top_k`); `cli_message` names the command-line flag (`--top-k`) instead."""

    def __init__(self, message: str, cli_message: str | None = None) -> None:
        super().__init__(message)
        self.cli_message = cli_message or message


class ConfigTypeError(ConfigError, TypeError):
    """A value of the wrong type (a LongswiftError and a TypeError): says what was expected."""
