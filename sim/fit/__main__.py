"""`python -m sim.fit`: sim/fit/fitfile.py."""

import sys

from sim.fit.fitfile import main

sys.exit(main())
