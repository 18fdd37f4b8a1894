"""The one exception type users see: a one-line message that says what is wrong and what to do."""


class LongswiftError(Exception):
    """A user-facing error; the CLI prints its message on one line and exits with status 2. Where the
    message names settings, it names them as the Python API spells them; `cli_message`, if given, names
    the command-line flags instead (`--top-k` for `SamplingConfig.top_k`)."""

    def __init__(self, message: str = "", cli_message: str | None = None) -> None:
        super().__init__(message)
        self.cli_message = cli_message or message


class ConfigError(LongswiftError, ValueError):
    """A bad config value: the message names the field (`SamplingConfig.top_k`), `cli_message` the flag."""


class ConfigTypeError(ConfigError, TypeError):
    """A value of the wrong type (a LongswiftError and a TypeError): says what was expected."""
