"""``python -m dsh_host`` is the ``dsh`` command."""

import sys

from .cli import main

sys.exit(main())
