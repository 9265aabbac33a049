"""autotune's zero-code instrumentation (autotune.instrument), loaded by Python at start-up from
the child's PYTHONPATH, as `opentelemetry-instrument` loads its own. Then the `sitecustomize` this one hides
(the next on sys.path), if any, runs as it would have."""

import importlib.machinery
import importlib.util
import os
import sys

try:
    if os.environ.get("AUTOTUNE_TRIAL") or os.environ.get("AUTOTUNE_CONFIG"):  # else nothing imported
        from autotune import instrument

        instrument.install()
finally:
    _here = os.path.dirname(os.path.abspath(__file__))
    _rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
