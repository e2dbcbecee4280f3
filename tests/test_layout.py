"""The plugin's map (issue 98): its root holds what a command line reaches, and each subpackage
imports only what its ``__init__`` says it may: ``errors`` first, then ``files``, ``modules`` and
``optim``, then ``options``, then ``models``; ``analysis`` reads them all, and ``patches``, which
changes fairseq, may import everything and is imported by the package alone. Read from the source
(``ast``): nothing is imported."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fairseq_realformer"
# what --user-dir, the flags, the variants, the one-line errors and realformer-user-dir reach
ROOT_MODULES = {"__init__.py", "options.py", "variants.py", "errors.py", "user_dir.py"}
SUBPACKAGES = {"models", "modules", "optim", "files", "patches", "analysis"}
ROOT_MODULES_AND_SUBPACKAGES = {name.removesuffix(".py") for name in ROOT_MODULES - {"__init__.py"}} | SUBPACKAGES
# the parts of the plugin (a root module or a subpackage) that each subpackage may import
MAY_IMPORT = {
    "files": {"errors"},
    "modules": {"errors"},
    "optim": {"errors", "files"},
    "models": {"errors", "files", "modules", "options"},
    "analysis": {"errors", "files", "modules", "optim", "options", "models", "variants"},
    "patches": ROOT_MODULES_AND_SUBPACKAGES,
}


def plugin_imports(path: Path):
    """The parts of the plugin (``errors``, ``files``, ...) that the module at *path* imports."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]  # a package's __init__: itself
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            names = [module] if node.module else [module + [alias.name] for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        else:
            continue
        found.update(name[1] for name in names if name[0] == "fairseq_realformer" and len(name) > 1)
    return found


def test_the_root_holds_only_what_a_command_line_reaches_and_the_subpackages():
    modules = {p.name for p in PACKAGE.glob("*.py")}
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert modules == ROOT_MODULES, "a new module belongs in the subpackage of its concern (docs/development.md)"
    assert folders == SUBPACKAGES
    for folder in folders:
        assert (PACKAGE / folder / "__init__.py").is_file(), folder


def test_each_subpackage_says_what_it_holds_and_may_import():
    assert set(MAY_IMPORT) == SUBPACKAGES
    for folder in SUBPACKAGES:
        docstring = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text(encoding="utf-8")))
        assert "may import" in docstring.lower(), folder


def test_the_imports_are_read_as_python_resolves_them():
    assert plugin_imports(PACKAGE / "patches" / "fixes" / "one_line_errors.py") >= {"errors", "files", "optim"}
    assert plugin_imports(PACKAGE / "patches" / "model_support.py") >= {"files", "optim", "models", "modules"}
    assert plugin_imports(PACKAGE / "options.py") >= {"files", "errors", "modules"}
    assert plugin_imports(PACKAGE / "__init__.py") == {"patches", "models", "optim"}


def test_each_subpackage_imports_only_what_it_may():
    for folder, allowed in MAY_IMPORT.items():
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            assert plugin_imports(path) - {folder} <= allowed, path.relative_to(PACKAGE)


def test_only_the_package_itself_imports_the_patches():
    """``patches`` changes fairseq and may import every part of the plugin: it comes last."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != PACKAGE / "__init__.py" and PACKAGE / "patches" not in path.parents:
            assert "patches" not in plugin_imports(path), path.relative_to(PACKAGE)


def test_the_errors_import_nothing_of_the_plugin():
    """Every part may name a flag or a file in one line: ``errors`` sits under them all."""
    assert plugin_imports(PACKAGE / "errors.py") == set()


# --- the harness: benchmarks/, studies/ and common/ -------------------------------------------------------

CHECKOUT = PACKAGE.parent
HARNESS = ("benchmarks", "studies", "common")
# the harness packages each may import (and the plugin, and itself)
HARNESS_MAY_IMPORT = {"common": set(), "benchmarks": {"common"}, "studies": {"common"}}


def harness_imports(path: Path):
    """The harness modules (``benchmarks.bench``, ``common.repo``, ...) that the module at *path*
    imports, as dotted names; a package import's names count as its modules where they are files."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(
            n for n in names if n.split(".")[0] in HARNESS and (CHECKOUT / f"{n.replace('.', '/')}.py").is_file()
        )
    return found


def harness_modules():
    return {
        ".".join(p.relative_to(CHECKOUT).with_suffix("").parts): p for h in HARNESS for p in (CHECKOUT / h).glob("*.py")
    }


def test_the_harness_is_packages_without_path_changes():
    """benchmarks/, studies/ and common/ import each other through their packages: no module of
    the checkout outside tests/ changes sys.path, and none imports a sibling as a top-level module
    (``from bench import``), which works only from its own folder."""
    modules = harness_modules()
    # but by_path, which a command imports from its own folder only when run by its path (that folder first on sys.path)
    siblings = {p.stem for p in modules.values()} - {"by_path"}
    for path in sorted(CHECKOUT.glob("[!.]*/**/*.py")):
        relative = path.relative_to(CHECKOUT)
        if relative.parts[0] in ("tests", "runs") or ".venv" in relative.parts:
            continue
        source = path.read_text(encoding="utf-8")
        assert "sys.path.insert" not in source and "sys.path.append" not in source, relative
    for folder in HARNESS:
        assert (CHECKOUT / folder / "__init__.py").is_file(), folder
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        top |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        assert not top & siblings, f"{name} imports {top & siblings} top-level"


def test_a_command_run_by_its_path_runs_as_its_module(tmp_path):
    """``python studies/depth_report.py`` from any folder runs ``python -m studies.depth_report`` of
    its checkout: every command's first lines, the same two, import common/by_path.py, linked beside it."""
    for folder in ("benchmarks", "studies"):
        assert (CHECKOUT / folder / "by_path.py").resolve() == CHECKOUT / "common" / "by_path.py"
    guard = 'if __name__ == "__main__" and not __package__:'
    commands = [p for p in (CHECKOUT / "benchmarks").glob("*.py") if guard in p.read_text(encoding="utf-8")]
    commands += [p for p in (CHECKOUT / "studies").glob("*.py") if guard in p.read_text(encoding="utf-8")]
    assert len(commands) >= 12
    for path in commands:
        lines = path.read_text(encoding="utf-8").splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(guard))
        assert lines[at + 1].strip().startswith("import by_path"), path.name
    run = subprocess.run(
        [sys.executable, CHECKOUT / "studies" / "depth_report.py", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0 and run.stdout.startswith("usage: depth_report.py"), run.stderr[-2000:]


def test_the_harness_imports_go_one_way():
    """common/ under benchmarks/ and studies/, which never import each other, and no circle of
    modules (bf16_speed.py and bf16_decode_speed.py imported each other once)."""
    modules = harness_modules()
    graph = {name: harness_imports(path) - {name} for name, path in modules.items()}
    for name, imported in graph.items():
        package = name.split(".")[0]
        assert {i.split(".")[0] for i in imported} - {package} <= HARNESS_MAY_IMPORT[package], name
    done, on_path = set(), []

    def visit(name):
        assert name not in on_path, "an import circle: " + " -> ".join([*on_path[on_path.index(name) :], name])
        if name in done:
            return
        on_path.append(name)
        for imported in sorted(graph.get(name, ())):
            visit(imported)
        on_path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
