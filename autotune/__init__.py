"""autotune: measured performance tuning for PyTorch training.

Importing this package is cheap: torch, Ray, MLflow and Optuna load only when a
command or function needs them.
"""

from autotune import adapters
from autotune._version import __version__
from autotune.api import search
from autotune.config import config, load_config
from autotune.workload import Workload

__all__ = ["Workload", "search", "config", "adapters", "load_config", "__version__"]
