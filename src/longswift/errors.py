"""The one exception type users see: a one-line message that says what is wrong and what to do."""


class LongswiftError(Exception):
    """A user-facing error; the CLI prints its message on one line and exits with status 2."""
