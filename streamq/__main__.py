"""`python -m streamq` is the `streamq` command."""

import sys

from streamq.cli import main

sys.exit(main())
