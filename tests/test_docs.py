"""The README and docs/ say what is true: the spec page is the generator's output, every relative link and every
path or module they name exists, and the README stays short."""

import importlib.util
import re
from pathlib import Path

import pytest

from autotune.cli import spec_docs

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# a repo path: scripts/x.py, autotune/knobs/_registry.py, search_spaces/quick.yaml (not one with a placeholder in it:
# scripts/measurements/<gpu>-<date>/; `trials/0000/` is a run dir's, so trials/ is left out)
REPO_PATH = re.compile(r"(?<![\w./<-])((?:scripts|autotune|search_spaces|tests|docs|\.ci)/[\w./-]*\w)(?![\w<*{])")
MODULE = re.compile(r"python -m ([\w.]+)")


def test_spec_page_is_the_generators_output():
    page = (ROOT / "docs" / "spec.md").read_text()
    assert page == spec_docs.render(), f"docs/spec.md is stale: regenerate it with `{spec_docs.REGENERATE}`"


def test_generator_names_every_spec_field():
    from autotune import spec as S

    page = spec_docs.render()
    for section in ("trial", "search", "resources", "tracking", "safety", "workload", "search_space"):
        model = S.Spec.model_fields[section].annotation
        for name in model.model_fields:
            assert f"`{section}.{name}`" in page
    for knob in S.KnobSettings.model_fields:
        assert f"| `{knob}` |" in page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_exist(page):
    text = page.read_text()
    targets = [t for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_named_paths_and_modules_exist(page):
    text = page.read_text()
    paths = set(REPO_PATH.findall(text))
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"
    modules = set(MODULE.findall(text))
    gone = sorted(m for m in modules if importlib.util.find_spec(m) is None)
    assert not gone, f"{page.relative_to(ROOT)} runs modules that do not exist: {gone}"


def test_readme_is_short_and_shows_the_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for line in (
        "bash scripts/quickstart.sh",
        "bash scripts/test.sh",
        "autotune search",
        "autotune report",
        "autotune export",
        "autotune ui",
        "load_config",
    ):
        assert line in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci  # the command the README gives is the one CI runs


def test_commands_named_exist():
    from autotune.cli.main import app

    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    named = set()
    for page in PAGES:
        # in backticks, or a line of a code block: `autotune search ...`, .venv/bin/autotune ui
        named |= set(re.findall(r"(?:`|^(?:\.venv/bin/)?)autotune ([a-z]+)", page.read_text(), re.MULTILINE))
    unknown = sorted(named - commands)
    assert {"search", "report", "export", "ui"} <= commands
    assert not unknown, f"the docs name commands autotune does not have: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_specs_shown_are_valid(page):
    """Every whole spec a page shows (a YAML block with `workload`) is one `autotune search` accepts."""
    import yaml

    from autotune import spec as S

    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.DOTALL)]
    for data in (b for b in blocks if isinstance(b, dict) and "workload" in b):
        S.parse(data, f"{page.name}'s spec")  # raises SpecError naming the field
