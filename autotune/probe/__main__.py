from __future__ import annotations

import sys

from autotune.probe.main import main

sys.exit(main())
