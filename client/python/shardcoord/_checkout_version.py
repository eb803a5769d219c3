"""shardcoord.__version__ when the package runs from a checkout (tools/python.sh): an
installed package has shardcoord/_version.py, which setup.py writes from client/version.h;
from a checkout the same file is read here."""

import os
import re

_VERSION_H = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "version.h")


def version():
    """kShardctlVersion from client/version.h, or "0+unknown" where it is not there."""
    try:
        with open(_VERSION_H, encoding="utf-8") as f:
            match = re.search(r'kShardctlVersion\[\]\s*=\s*"([^"]+)"', f.read())
    except OSError:
        return "0+unknown"
    return match.group(1) if match else "0+unknown"
