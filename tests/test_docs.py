"""The documentation matches the code: every file docs/architecture.md names exists, the README
stays a guide, and the layers point the way the architecture says."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "dreamgym"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _importers(folder: Path, forbidden: str) -> list[str]:
    return sorted(
        str(path.relative_to(REPO))
        for path in folder.rglob("*.py")
        if any(name == forbidden or name.startswith(f"{forbidden}.") for name in _imports(path))
    )


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("dreamgym", "flows"),  # flows import the library, never the reverse
        ("dreamgym/policy", "dreamgym.experience"),  # what both need is in dreamgym.lm / placeholders / domain
        ("dreamgym/rl", "dreamgym.experience"),
        ("dreamgym/envs", "dreamgym.experience"),  # DreamEnv depends on the Dynamics protocol
        ("dreamgym/lm", "dreamgym.experience"),
        ("dreamgym/buffer", "dreamgym.experience"),
    ],
)
def test_layers_point_one_way(folder, forbidden):
    assert _importers(REPO / folder, forbidden) == []


def test_generic_code_never_imports_the_textworld_specifics():
    for folder in ("buffer", "lm", "policy", "rl", "experience"):
        for package in ("dreamgym.envs.textworld", "dreamgym.envs.scienceworld"):
            assert _importers(LIBRARY / folder, package) == [], (folder, package)
    # The experience model and BC reach TextWorld cooking's rules through the domain seam alone.
    assert _importers(LIBRARY, "dreamgym.envs.textworld.cooking") == ["dreamgym/domain.py"]


# The real environments' packages, and the only modules that may import them when they are
# imported themselves: the packages, the one module naming the real environments, the rules seam,
# the composition of params.yaml's sections and the commands (`dreamgym games` makes either's tasks).
ENVIRONMENT_PACKAGES = ("dreamgym.envs.textworld", "dreamgym.envs.scienceworld")
ENVIRONMENT_SEAMS = (
    "dreamgym/envs/textworld/",
    "dreamgym/envs/scienceworld/",
    "dreamgym/envs/real.py",
    "dreamgym/domain.py",
    "dreamgym/config.py",
    "dreamgym/commands/",
)


def _module_level_imports(source: str) -> set[str]:
    """The modules a source imports when it is imported itself: at top level, in a class body, under
    `if`/`try`/`with`, but not inside a function nor under `if TYPE_CHECKING:`. `from a import b`
    counts as importing `a` and `a.b` (b may be a module)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for statement in child.orelse:
                    visit(ast.Module(body=[statement], type_ignores=[]))
            elif isinstance(child, ast.Import):
                names.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                names.add(child.module)
                names.update(f"{child.module}.{alias.name}" for alias in child.names)
            else:
                visit(child)

    visit(ast.parse(source))
    return names


def _environment_packages(names: set[str]) -> list[str]:
    return sorted(
        name
        for name in names
        if any(name == package or name.startswith(f"{package}.") for package in ENVIRONMENT_PACKAGES)
    )


def test_only_the_environment_seams_import_an_environment_s_package_at_module_level():
    """Environment-specific code lives in one package per environment (envs/textworld/,
    envs/scienceworld/); generic code reaches it through envs/real.py or domain.py, or imports it
    inside the one function that needs it, never when it is imported itself."""
    offenders = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if not name.startswith(ENVIRONMENT_SEAMS):
            found = _environment_packages(_module_level_imports(path.read_text()))
            if found:
                offenders[name] = found
    assert offenders == {}
    # The walk sees what it should: config.py imports both sections at module level, envs/real.py
    # names both only inside its functions, and a guarded or a function's import does not count.
    assert _environment_packages(_module_level_imports((LIBRARY / "config.py").read_text())) == [
        "dreamgym.envs.scienceworld.config",
        "dreamgym.envs.scienceworld.config.ScienceWorldConfig",
        "dreamgym.envs.textworld.config",
        "dreamgym.envs.textworld.config.GamesConfig",
        "dreamgym.envs.textworld.config.MAX_SEED",
    ]
    assert _environment_packages(_module_level_imports((LIBRARY / "envs" / "real.py").read_text())) == []
    sample = """
from dreamgym.envs import textworld
if TYPE_CHECKING:
    import dreamgym.envs.scienceworld.env
class A:
    import dreamgym.envs.scienceworld.tasks
def f():
    import dreamgym.envs.textworld.games
"""
    assert _environment_packages(_module_level_imports(sample)) == [
        "dreamgym.envs.scienceworld.tasks",
        "dreamgym.envs.textworld",
    ]


def _named_paths(text: str) -> set[str]:
    """Paths a document names in backticks, relative to the repository or to dreamgym/."""
    return {match for match in re.findall(r"`([\w./*-]+\.(?:py|md|yaml|toml|sql)|[\w-]+/)`", text)}


def test_every_file_the_architecture_names_exists():
    text = (REPO / "docs" / "architecture.md").read_text()
    named = _named_paths(text)
    assert len(named) > 30  # the document does name the parts
    missing = [
        name
        for name in named
        if not any(
            list(base.glob(name.replace("NNN", "[0-9][0-9][0-9]")))
            for base in (REPO, LIBRARY, LIBRARY / "experience", REPO / "flows")
        )
    ]
    assert missing == []


def test_the_readme_is_a_guide_and_its_links_resolve():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert not re.search(r"\bOn 20\d\d-\d\d-\d\d\b", readme)  # dated diary paragraphs live in benchmarks/results
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    assert [link for link in links if not link.startswith("http") and not (REPO / link).exists()] == []


def test_the_cli_starts_flows_that_exist():
    cli = (LIBRARY / "cli.py").read_text()
    entrypoints = re.findall(r'"(flows\.\w+:\w+)"', cli)
    assert len(entrypoints) == 3
    for entrypoint in entrypoints:
        module, function = entrypoint.split(":")
        source = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
        assert function in {node.name for node in source.body if isinstance(node, ast.FunctionDef)}, entrypoint


def test_the_readme_s_tables_read_at_a_glance_and_its_results_are_generated():
    from dreamgym.ops.results import refresh_readme

    readme = (REPO / "README.md").read_text()
    cells = [cell for line in readme.splitlines() if line.startswith("|") for cell in line.strip("|").split("|")]
    assert cells and max(len(cell.split()) for cell in cells) <= 30
    # The results table is what `dreamgym results` makes of the bench files it names.
    assert not refresh_readme(REPO / "README.md", check=True), "stale results table: run `dreamgym results`"


@pytest.mark.parametrize(("row", "module", "protocol"), [
    ("environment", "dreamgym.envs.base", "Env"),
    ("dynamics", "dreamgym.envs.dynamics", "Dynamics"),
])  # fmt: skip
def test_the_architecture_names_each_protocol_s_methods(row, module, protocol):
    """The contracts table names exactly the methods of each protocol the code defines."""
    import importlib

    text = (REPO / "docs" / "architecture.md").read_text()
    [line] = [line for line in text.splitlines() if line.startswith(f"| {row} |")]
    assert f"`{protocol}`" in line
    named = set(re.findall(r"`(\w+)\(", line))
    cls = getattr(importlib.import_module(module), protocol)
    methods = {
        name
        for name, value in vars(cls).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }
    assert named == methods
