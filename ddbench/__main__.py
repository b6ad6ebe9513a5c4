import os
import sys

from ddbench.cli import main

code = main()
if code == 130:
    # Interrupted, and main() has cleaned up: leave now, so that nothing run while the interpreter shuts down
    # (a finaliser of a held-signal block) can turn the exit into a death by SIGINT.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(130)
raise SystemExit(code)
