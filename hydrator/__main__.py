"""``python -m hydrator`` is the ``hydrator`` command."""

import sys

from hydrator.cli import main

sys.exit(main())
