"""The package's shape: no two modules of autotune/ import each other (one of
them should not need the other), read from the source with `ast`, so an import
inside a function counts too."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The autotune modules `path` imports anywhere in its body (`from a import b`
    names the module a.b where that is a module, else a)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                out.add(full if full in modules else base)
    return (out & modules) - {name}


def cycles() -> list[tuple[str, str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in files}
    deps = {module_name(p): imports(p, modules) for p in files}
    # a package's __init__ re-exports its modules: the modules may import their package's private siblings
    return sorted(
        {
            tuple(sorted((a, b)))
            for a, bs in deps.items()
            for b in bs
            if a in deps.get(b, ()) and not (a.startswith(b + ".") or b.startswith(a + "."))
        }
    )


def test_no_two_modules_import_each_other():
    assert cycles() == [], "modules that import each other (one should not need the other)"


def test_the_check_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    pkg = tmp_path / "autotune"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from autotune.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from autotune import a\n")
    monkeypatch.setitem(globals(), "PACKAGE", pkg)
    assert cycles() == [("autotune.a", "autotune.b")]


def test_the_public_names_survive_importing_every_module():
    """A sub-package named like a public function (`autotune.search`) replaces it on
    the package once imported: the public API must stay what it is."""
    import importlib
    import pkgutil

    import autotune

    for info in pkgutil.walk_packages(autotune.__path__, "autotune."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    assert callable(autotune.search) and callable(autotune.load_config)
