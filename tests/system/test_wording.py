"""The product speaks to its users in its own words: no page, script, message or exported file mentions the source
articles the panel was modelled on ("the seeds") or their section numbers ("§5.3"). Checked on every template and
script, and on every string in the panel's code that is not a docstring (messages, help texts, exported files)."""
import ast
import re

from tests.support.environment import ROOT

FOREIGN = re.compile(r"§|\bseeds'|\bthe seeds\b|\bseeds? §|\(seeds\b", re.IGNORECASE)


def string_literals(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_page_or_script_speaks_of_the_articles():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
             for folder, pattern in (("templates", "*.html"), ("static", "*.js"))
             for path in (ROOT / folder).rglob(pattern)
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if FOREIGN.search(line)]
    assert found == []


def test_no_message_of_the_panel_speaks_of_the_articles():
    found = [f"{path.relative_to(ROOT)}:{number}: {text.strip()[:100]}"
             for path in list((ROOT / "panel").rglob("*.py")) + list((ROOT / "engine").rglob("*.py"))
             if "migrations" not in path.parts
             for number, text in string_literals(path) if FOREIGN.search(text)]
    assert found == []


def test_the_check_finds_such_words():
    assert FOREIGN.search("outside the range the seeds recommend (§3.1)")
    assert FOREIGN.search("vLLM refuses to start (seeds §5.5).")
    assert not FOREIGN.search("manage.py seed_usage 100000 writes synthetic records")
