"""best_config.yaml read: `read`, the one reader of the file (`autotune.load_config` and `autotune.config(path)`,
whose config applies it: autotune.config.Config; the CLI's `export` and `run`), the compiled artifacts beside it
found wherever the file is. Needs yaml alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read(path: str | Path) -> dict[str, Any]:
    """A best_config.yaml's content: the one reader of the file (`load_config`, `autotune.config(path)`, the CLI's
    `export` and `run`). ValueError when it is not one (no `knobs` mapping)."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("knobs"), dict):
        raise ValueError(f"`{path}` is not an autotune best_config.yaml (no `knobs` mapping)")
    artifacts = data.get("compile_artifacts")
    if isinstance(artifacts, dict) and isinstance(artifacts.get("file"), str):  # beside the file, wherever it is
        data["compile_artifacts"] = {**artifacts, "path": str(Path(path).resolve().parent / artifacts["file"])}
    return data
