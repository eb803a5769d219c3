"""shardcoord.Error: every failure of the package's calls."""


class Error(Exception):
    """A failed call: `code` is the gRPC status name ("NOT_FOUND", "INVALID_ARGUMENT"),
    `message` the reason, naming the field and value. `member`: for a call on many tensors
    (attach_many, lend, receive), the name of the one that failed; None otherwise."""

    def __init__(self, code, message, member=None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.member = member
