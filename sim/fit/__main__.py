"""`python -m ddbench.sim.fit`: sim/fit/fitfile.py."""

import sys

from ddbench.sim.fit.fitfile import main

sys.exit(main())
