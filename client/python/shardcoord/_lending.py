"""Helpers of the calls that lend many buffers at once (Client.attach_many, lend, receive)."""

import re

import numpy as np

from ._errors import Error

_MEMBER = re.compile(r"^attachments\[(\d+)\]")


def member_of(message, items):
    """The name of the attachment an attach_many error names ("attachments[i] ..."), else
    None."""
    m = _MEMBER.match(message)
    if m and int(m.group(1)) < len(items):
        return items[int(m.group(1))][0]
    return None


def local_tensors(state_dict, what, writable):
    """(name, local buffer) of every entry of a state dict (a mapping or (name, tensor)
    pairs): a DTensor's local shard (to_local()), a torch tensor detached from autograd,
    a NumPy array as is; with `writable`, read-only arrays are refused."""
    items = list(state_dict.items()) if hasattr(state_dict, "items") else list(state_dict)
    if not items:
        raise ValueError(f"{what}: empty")
    out = []
    for i, (name, value) in enumerate(items):
        if hasattr(value, "to_local") and hasattr(value, "placements"):
            value = value.to_local()  # A DTensor: this rank's shard.
        if hasattr(value, "detach") and not isinstance(value, np.ndarray):
            value = value.detach()    # A Parameter: the same memory, without autograd.
        if writable and isinstance(value, np.ndarray) and not value.flags.writeable:
            raise Error("INVALID_ARGUMENT", f"attachments[{i}] '{name}': buffer: the NumPy "
                                            "array is read-only; copies cannot write it",
                        member=name)
        out.append((name, value))
    return out


def nbytes_of(buf):
    if isinstance(buf, np.ndarray):
        return buf.nbytes
    return buf.numel() * buf.element_size()


def human_bytes(nbytes):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


class Silent:
    """A stream that is no terminal: Progress stays quiet."""

    @staticmethod
    def isatty():
        return False
