"""``python -m dsh_host`` is the ``dsh`` command."""

import sys

from ._cli import main

sys.exit(main())
