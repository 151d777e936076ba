"""`python -m twofold ARGS...`: the installed binary, as `twofold ARGS...`."""

import os
import sys

from ._binary import TwofoldError, binary

if __name__ == "__main__":
    try:
        exe = binary()
    except TwofoldError as e:
        sys.exit(f"twofold: error: {e.message}")
    os.execv(exe, [exe, *sys.argv[1:]])
