"""`python -m ddbench.doctables`: see ddbench/doctables/__init__.py."""

import sys

from ddbench.doctables import main

sys.exit(main())
