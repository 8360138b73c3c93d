"""The exit codes of the `trainer` command, a contract other tools script against (README)."""

EXIT_OK = 0  # every object admitted
EXIT_REFUSED = 1  # an object was refused; each refusal on stderr
EXIT_USAGE = 2  # usage errors, unreadable input, syntax errors
EXIT_INTERNAL = 3  # an internal error
