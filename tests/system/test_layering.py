"""The layering, checked on the project's own imports (every import, those inside functions too): the apps stand in
layers and an app imports only apps below it (so no two apps import each other, and there is no cycle); no module
imports a private name (`_x`) of another app; no API module imports page views; the engine package imports nothing
of the panel; the top-level modules (settings, urls, the ASGI app, the launcher, seeding) and the Celery package sit
above every app. docs/ARCHITECTURE.md draws the same layers."""
import ast
import re

from tests.support.environment import ROOT

# Bottom first. An app may import the apps listed before it, never one listed after it.
LAYERS = [
    "core",
    "audit",
    "accounts",
    "sso",
    "notifications",
    "jobs",
    "hosts",
    "registry",
    "usage",
    "channels",
    "serving",
    "budgets",
    "gateway",
    "compare",
    "evaluations",
    "dashboards",
    "benchmarks",
    "advisor",
    "api",
]
# Project modules that apps may use (settings helpers), and the ones that sit above every app.
BELOW_APPS = {"panel.env"}
ABOVE_APPS = {"panel.settings", "panel.urls", "panel.asgi", "panel.wsgi", "panel.launcher", "panel.bootstrap",
              "panel.views", "panel.static_files", "panel"}


def python_files(folder):
    return [path for path in (ROOT / folder).rglob("*.py") if "migrations" not in path.parts]


def module_of(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module):
    """The layering unit a module belongs to: an app's name, `engine`, `workers`, or a project module's name."""
    parts = module.split(".")
    if parts[0] == "panel" and len(parts) >= 2 and (ROOT / "panel" / parts[1]).is_dir():
        return parts[1]
    if parts[0] == "panel":
        return ".".join(parts[:2])
    return parts[0]


def imports_of(path):
    """(imported module, names) for every import statement in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            found.append((module, [alias.name for alias in node.names]))
    return found


def project_imports():
    """(importing file, importing unit, imported module, imported unit, names) across panel/, workers/, engine/."""
    for folder in ("panel", "workers", "engine"):
        for path in python_files(folder):
            source = unit_of(module_of(path))
            for module, names in imports_of(path):
                if module.split(".")[0] in ("panel", "workers", "engine"):
                    yield path.relative_to(ROOT), source, module, unit_of(module), names


def rank(unit):
    if unit in LAYERS:
        return LAYERS.index(unit)
    if unit in BELOW_APPS:
        return -1
    return len(LAYERS)  # workers, and the project modules above every app


def test_every_app_is_in_a_layer():
    apps = {path.name for path in (ROOT / "panel").iterdir() if (path / "apps.py").exists()}
    assert apps == set(LAYERS)


def test_apps_import_only_the_apps_below_them():
    upward = sorted({f"{path}: {source} imports {module} ({target} is not below {source})"
                     for path, source, module, target, _ in project_imports()
                     if source != target and source in LAYERS and rank(target) >= rank(source)})
    assert upward == []


def test_nothing_imports_another_apps_private_names():
    private = sorted({f"{path}: {module}.{name}" for path, source, module, target, names in project_imports()
                      for name in names + module.split(".") if name.startswith("_") and not name.startswith("__")
                      and source != target})
    assert private == []


def test_no_api_module_imports_a_module_of_page_views():
    """An API operation names its action in panel/accounts/roles.py, as the page doing the same thing does; it
    never reads a role (or anything else) from a page view."""
    pages = {module_of(path) for path in python_files("panel") if re.search(r"^@team_view\(", path.read_text(), re.M)}
    assert "panel.registry.views" in pages and "panel.accounts.audit_views" in pages
    reaching = sorted({f"{path}: {module}" for path, source, module, _, names in project_imports()
                       if source == "api" and {module, *(f"{module}.{name}" for name in names)} & pages})
    assert reaching == []


def test_the_engine_package_imports_nothing_of_the_panel():
    reaching_out = sorted({f"{path}: {module}" for path, source, module, target, _ in project_imports()
                           if source == "engine" and target != "engine"})
    assert reaching_out == []
    third_party = {module.split(".")[0] for path in python_files("engine") for module, _ in imports_of(path)}
    assert not third_party & {"django", "celery", "panel", "workers"}


def test_every_engine_runner_speaks_through_the_one_protocol_module():
    """The JSON-lines protocol is written once (engine/protocol.py); the llm-compressor runner shares the checkpoint
    handling with AutoAWQ's through engine/checkpoint.py, so deleting the AutoAWQ runner breaks nothing else."""
    for path in python_files("engine"):
        source = path.read_text()
        assert "print(json.dumps(" not in source or path.name == "protocol.py", path
    importers_of_awq_runner = sorted(str(path) for path in python_files("engine")
                                     if any(module == "engine.quantize_runner" or "quantize_runner" in names
                                            for module, names in imports_of(path)))
    assert importers_of_awq_runner == []


def test_the_workers_package_is_the_celery_app_and_its_start_up_only():
    assert sorted(path.name for path in (ROOT / "workers").glob("*.py")) == ["__init__.py", "celery.py", "start.py"]


def test_the_check_sees_an_upward_import():
    """The walk is not vacuous: it finds every kind of import this project uses."""
    found = {(source, target) for _, source, _, target, _ in project_imports()}
    assert ("gateway", "channels") in found  # module level
    assert ("registry", "jobs") in found
    assert ("engine", "engine") in found  # `from engine import awq_calibration`


def test_no_module_imports_itself_back():
    """No cycle between modules either, inside an app or across (a ladder importing services importing tasks
    importing the ladder is a concept in the wrong place)."""
    modules = {module_of(path) for folder in ("panel", "workers", "engine") for path in python_files(folder)}
    graph = {}
    for path, _, module, _, names in project_imports():
        source = module_of(ROOT / path)
        for imported in [module] + [f"{module}.{name}" for name in names]:
            if imported in modules and imported != source:
                graph.setdefault(source, set()).add(imported)
    cycles, done, trail = [], set(), []

    def visit(module):
        if module in trail:
            cycles.append(trail[trail.index(module):] + [module])
            return
        if module in done:
            return
        trail.append(module)
        for imported in sorted(graph.get(module, ())):
            visit(imported)
        trail.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    assert cycles == []
