"""Optional dependencies: whether one is installed, asked without importing it (Ray and MLflow take seconds to
import, and a host may lack them: the GPU hosts run searches with torch, optuna and the CLI's own packages)."""

from __future__ import annotations

import importlib.util


def installed(name: str) -> bool:
    """Whether `import name` can succeed here (False where an import hook or `sys.modules[name] = None` hides it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without a spec (None: hidden)
        return False
