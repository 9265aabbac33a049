"""The README and docs/ say what is true: the spec page is the generator's output, every relative link and every
path or module they name exists, and the README stays short. Every `autotune.<name>` the package, the tests, the
scripts and the pages name exists, and none sends the reader to notes outside the repository."""

import ast
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


NOT_MODULES = {"autotune.role", "autotune.version", "autotune.run_dir"}  # MLflow tags (integrations/tracking.py)


def _bound(scope: ast.AST) -> dict[str, ast.AST]:
    """The names a module or class body binds (under `if`/`try` too; a class's: what its methods set on `self`)."""
    out = {}
    for node in getattr(scope, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update((n.id, node) for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            out.update(_bound(node))
    if isinstance(scope, ast.ClassDef):  # and what its methods set on `self`
        for node in ast.walk(scope):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and ast.unparse(node.value) == "self"
            ):
                out.setdefault(node.attr, node)
    return out


def resolves(name: str, root: Path = ROOT) -> bool:
    """A dotted name (package.module.Class.method): the longest module (or folder) of it exists, and what follows
    is bound there: a name of the module, then of a class (a value's or an imported name's attributes are not
    followed)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:i])
        source = next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.exists()), None)
        if source is not None or base.is_dir():
            break
    else:
        return False
    scope = ast.parse(source.read_text()) if source else None
    for part in parts[i:]:
        node = _bound(scope).get(part) if scope else None
        if node is None:
            return part.startswith("__") and scope is not None and not isinstance(scope, ast.ClassDef)
        if not isinstance(node, ast.ClassDef):
            return True
        scope = node
    return True


def stale_names(root: Path = ROOT, package: str = "autotune") -> dict[str, list[str]]:
    """Each `autotune.<name>` that autotune/, tests/, scripts/, docs/ and the README name and that does not
    resolve, with where. The measurements' records (scripts/measurements, but their scripts) name the code of
    their day, and are left as they were."""
    named = re.compile(rf"(?<![\w./-]){package}(?:\.[A-Za-z_]\w*)+")
    dirs = (package, "tests", "scripts", "docs")
    files = [root / "README.md", *(f for d in dirs for f in (root / d).rglob("*"))]
    out: dict[str, list[str]] = {}
    for f in sorted(files):
        rel = f.relative_to(root).as_posix()
        if (
            not f.is_file()
            or f.suffix not in (".py", ".md", ".sh")
            or (rel.startswith("scripts/measurements/") and f.suffix != ".py")
        ):
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for name in named.findall(line):
                if name not in NOT_MODULES and not resolves(name, root):
                    out.setdefault(name, []).append(f"{rel}:{n}")
    return out


def test_every_module_named_exists():
    """A docstring, comment or page that names `autotune.<module>` (or a function or class in it) names what
    there is: a reader can follow it."""
    assert stale_names() == {}


def test_the_name_check_sees_a_stale_name(tmp_path):
    (tmp_path / "planted" / "trial").mkdir(parents=True)
    (tmp_path / "planted" / "__init__.py").write_text("from planted.api import search\n")
    (tmp_path / "planted" / "api.py").write_text(
        "class Result:\n    speed = 1\n\n    def __init__(self):\n        self.size = 2\n\n\ndef search():\n    pass\n"
    )
    (tmp_path / "planted" / "trial" / "__init__.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text(
        "`planted.search`, `planted.api.Result.speed`, `planted.api.Result.size`, `planted.api.search.x` and\n"
        "`planted.trial` exist;\n"
        "`planted.confirm`, `planted.api.Result.gone`, `planted.trial.runner` and `planted.api.nothing` do not\n"
    )
    assert stale_names(tmp_path, "planted") == {
        name: ["docs/x.md:3"]
        for name in ("planted.confirm", "planted.api.Result.gone", "planted.trial.runner", "planted.api.nothing")
    }


OUTSIDE = re.compile(r"\b(?:DESIGN|PLAYBOOK|STYLE)(?:\.md| facts)")  # the working notes beside the repository


def test_no_file_sends_the_reader_outside_the_repository():
    """What the code relies on from the notes the project was built with is in docs/design.md: no docstring,
    comment or page names those notes, which a reader of the repository does not have."""
    files = [ROOT / "README.md", *(f for d in ("autotune", "tests", "scripts", "docs") for f in (ROOT / d).rglob("*"))]
    named = [
        f"{f.relative_to(ROOT)}:{n}"
        for f in files
        if f.is_file() and f.suffix in (".py", ".md", ".sh")
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert named == [], "point at docs/design.md instead"
