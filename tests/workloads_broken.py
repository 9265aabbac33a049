"""A workload module whose own import fails: a dependency is missing."""

import a_dependency_not_installed  # noqa: F401
