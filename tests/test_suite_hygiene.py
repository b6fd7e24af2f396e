"""The suite's own rules, at the level an AST can see them: every test checks something, no
comparison is computed and thrown away, no assertion compares a thing with itself, and no test
waits a fixed time where it could wait for a condition (a sleep outside a polling `while` loop
needs a reason here)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CHECK_PREFIXES = ("assert", "check", "expect", "_assert", "_check", "_expect")
# pytest's own checks, and subprocess.run(..., check=True)
CHECK_CALLS = {"raises", "warns", "fail", "approx", "deprecated_call"}

# Sleeps that are not waits for a condition, by (file, enclosing function): why each one stays.
SLEEP_ALLOWED = {
    ("test_train.py", "slow_step"): "a training step made slow on purpose: the time budget is what is tested",
    ("test_loadtest.py", "stream"): "the fake server's own latency and pacing, the thing the test measures",
    ("request_isolation_fixtures.py", "paced_step"): "steps slowed on purpose, so a victim is still decoding while "
                                                     "a hostile request is answered, whatever the host's speed",
}


def _sources() -> list[tuple[str, ast.Module]]:
    return [(p.name, ast.parse(p.read_text(), filename=str(p))) for p in sorted(TESTS.glob("*.py"))]


def _called_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _checks_directly(fn: ast.AST) -> bool:
    """An assert, pytest.raises / warns / fail / approx, a call of an assert* / check* / expect*
    function, or check=True (subprocess.run) anywhere in the test's own body."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if name.startswith(CHECK_PREFIXES) or name in CHECK_CALLS:
                return True
            if any(k.arg == "check" and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords):
                return True
    return False


def _test_functions(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            yield node


def test_every_test_checks_something():
    silent = [f"{file}::{fn.name}" for file, tree in _sources() if file.startswith("test_")
              for fn in _test_functions(tree) if not _checks_directly(fn)]
    assert not silent, f"tests with no assert, pytest.raises or assert*/check*/expect* call: {silent}"


def _dropped(tree: ast.Module) -> list[int]:
    """Lines of `f(x) == y` or `check(...) and x is None` as a statement: it checks nothing."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, (ast.Compare, ast.BoolOp))]


def _tautologies(tree: ast.Module) -> list[int]:
    """Lines of `assert x == x` (any operator): true, or false, whatever the code does."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert) and isinstance(n.test, ast.Compare)
            and len(n.test.comparators) == 1 and ast.dump(n.test.left) == ast.dump(n.test.comparators[0])]


def test_no_comparison_is_computed_and_dropped():
    dropped = [f"{file}:{line}" for file, tree in _sources() for line in _dropped(tree)]
    assert not dropped, f"comparisons whose result is thrown away: {dropped}"


def test_no_assertion_compares_a_thing_with_itself():
    same = [f"{file}:{line}" for file, tree in _sources() for line in _tautologies(tree)]
    assert not same, f"tautological assertions: {same}"


def _fixed_sleeps(file: str, tree: ast.Module) -> list[tuple[str | None, int]]:
    """(enclosing function, line) of each sleep call whose nearest enclosing loop is not a `while`."""
    found = []

    def visit(node: ast.AST, function: str | None, loop: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            f, lp = function, loop
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                f, lp = child.name, None
            elif isinstance(child, ast.While):
                lp = "while"
            elif isinstance(child, (ast.For, ast.AsyncFor)):
                lp = "for"
            if isinstance(child, ast.Call) and _called_name(child) == "sleep" and loop != "while":
                found.append((function, child.lineno))
            visit(child, f, lp)

    visit(tree, None, None)
    return found


def test_no_fixed_sleep_where_a_condition_could_be_awaited():
    found = {(file, function): line for file, tree in _sources() for function, line in _fixed_sleeps(file, tree)}
    unexplained = [f"{file}:{line} in {function}" for (file, function), line in found.items()
                   if (file, function) not in SLEEP_ALLOWED]
    assert not unexplained, f"sleeps outside a polling loop (wait for a condition, or add a reason): {unexplained}"
    assert set(SLEEP_ALLOWED) <= set(found), f"allowed sleeps no longer there: {set(SLEEP_ALLOWED) - set(found)}"


def test_the_checks_catch_what_they_are_for():
    """Each rule fails on a small example of what it forbids (and passes the fixed version)."""
    bad = ast.parse("def test_a():\n    f()\n\ndef test_b():\n    check(x) and y is None\n"
                    "def test_c():\n    assert z == z\n\ndef test_d():\n    time.sleep(5)\n    assert ok()\n")
    assert [fn.name for fn in _test_functions(bad) if not _checks_directly(fn)] == ["test_a"]
    assert _dropped(bad) == [5] and _tautologies(bad) == [7]
    assert _fixed_sleeps("x.py", bad) == [("test_d", 10)]
    good = ast.parse("def poll():\n    while not ready():\n        time.sleep(0.01)\n")
    assert _fixed_sleeps("x.py", good) == []
