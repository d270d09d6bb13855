"""``python -m hydrator`` is the ``hydrator`` command."""

import sys

from hydrator.runtime.cli import main

sys.exit(main())
