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
