"""`python -m autotune.trial CONFIG.json [-o RESULT.json] [--set knob=value ...]`: one trial, by hand."""

import sys

from autotune.trial.runner import main

sys.exit(main())
