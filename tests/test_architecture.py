"""docs/ARCHITECTURE.md is true: every import of ours follows the dependency block, every module is
in the layout block (and every file there exists), SGLang is imported only where the document says,
and the engine's step reads as schedule, run, postprocess, record."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sglang_dspark"
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def _block(kind: str) -> str:
    match = re.search(rf"```{kind}\n(.*?)```", DOC, re.S)
    assert match, f"docs/ARCHITECTURE.md has no ```{kind} block"
    return match.group(1)


def allowed_imports() -> dict[str, set[str]]:
    rules = {}
    for line in _block("dependencies").splitlines():
        if line.strip():
            unit, _, deps = line.partition("->")
            rules[unit.strip()] = set() if deps.strip() == "-" else {d.strip() for d in deps.split(",")}
    return rules


def _unit(path: Path) -> str:
    """The top-level package or module of sglang_dspark a file belongs to."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imports_of(path: Path) -> tuple[set[str], set[str]]:
    """(units of ours this file imports, top-level third-party modules it imports)."""
    ours, others = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "sglang_dspark":
                if len(parts) > 1:
                    ours.add(parts[1])
            else:
                others.add(parts[0])
    return ours, others


def test_every_import_follows_the_diagram():
    rules = allowed_imports()
    sglang_importers = set(_block("sglang-importers").split())
    units = {_unit(p) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE}
    assert units == set(rules), f"diagram and code disagree on the units: {units ^ set(rules)}"
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent == PACKAGE and path.name == "__init__.py":
            continue
        unit = _unit(path)
        ours, others = imports_of(path)
        for target in ours - {unit} - {"__version__"}:
            if target not in rules[unit]:
                violations.append(f"{path.relative_to(ROOT)} imports {target} ({unit} may import {sorted(rules[unit])})")
        if "sglang" in others and unit not in sglang_importers:
            violations.append(f"{path.relative_to(ROOT)} imports sglang")
    assert not violations, "\n".join(violations)


def test_the_diagram_has_no_cycle():
    rules = allowed_imports()
    order = []
    while rules:
        ready = [u for u, deps in rules.items() if deps <= set(order)]
        assert ready, f"cycle among {sorted(rules)}"
        order += ready
        for u in ready:
            rules.pop(u)


def test_layout_lists_every_module_and_nothing_else():
    listed, stack = set(), []
    for line in _block("layout").splitlines():
        match = re.match(r"^( *)(\S+)", line)
        if not match or match.group(2).startswith(("(", "`")) or line.strip().startswith(("package", "quickstart")):
            continue
        depth, name = len(match.group(1)) // 2, match.group(2)
        if not name.endswith((".py", "/")) and "." not in name:
            continue  # a continuation line of a description
        stack = stack[:depth] + [name]
        listed.add("".join(stack))
    modules = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    listed_modules = {p for p in listed if p.endswith(".py") and p.startswith("sglang_dspark/")}
    assert modules == listed_modules, f"missing from the layout: {sorted(modules - listed_modules)}; " \
                                      f"listed but absent: {sorted(listed_modules - modules)}"
    for path in listed:
        assert (ROOT / path).exists(), f"the layout lists {path}, which does not exist"


def test_engine_step_reads_as_schedule_run_postprocess_record():
    from sglang_dspark.engine.engine import Engine

    tree = ast.parse(inspect.getsource(Engine.step).strip())
    calls = sorted((n.lineno, n.col_offset, n.func.attr) for n in ast.walk(tree) if isinstance(n, ast.Call)
                   and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id == "self")
    calls = [name for *_, name in calls]
    assert calls[:4] == ["schedule", "run", "postprocess", "record"], calls


def _module_graph() -> dict[str, set[str]]:
    """Every module of the package and of benchmarks/ -> the modules of ours it imports, anywhere in
    the file (a lazy import inside a function is an arrow too). A parent package run on the way to
    its submodule is not an arrow; benchmarks import each other by bare name (they run as scripts)."""
    files = {}
    for folder in (PACKAGE, ROOT / "benchmarks"):
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    tests = {p.stem for p in (ROOT / "tests").glob("*.py")}

    def ours(name: str) -> str | None:
        parts = name.split(".")
        return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in files), None)

    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        arrows = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for name in names:
                if module.startswith("benchmarks.") and name.split(".")[0] in tests:
                    arrows.add(f"tests.{name}")
                    continue
                if module.startswith("benchmarks.") and f"benchmarks.{name}" in files:
                    name = f"benchmarks.{name}"
                target = ours(name)
                if target and target != module:
                    arrows.add(target)
        graph[module] = arrows
    return graph


def test_no_module_of_the_package_or_benchmarks_imports_in_a_circle():
    graph = _module_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target in graph and target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_benchmark_imports_the_tests():
    leaks = sorted(f"{m} imports {t}" for m, ts in _module_graph().items() for t in ts if t.startswith("tests."))
    assert not leaks, "benchmarks share code through sglang_dspark/testing/, not tests/: " + "; ".join(leaks)


def _protocol_methods(cls) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(cls).items()
            if callable(fn) and not name.startswith("_")}


def test_the_drafter_calls_on_its_backend_only_what_the_protocol_declares():
    from sglang_dspark.drafter.backend import DraftBackend

    declared = set(_protocol_methods(DraftBackend))
    tree = ast.parse((PACKAGE / "drafter" / "model.py").read_text())
    called = set()
    for node in ast.walk(tree):  # backend.f(...), rows.f(...), self.rows.f(...), self.backend_for(kv).f(...)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if (isinstance(owner, ast.Name) and owner.id in ("rows", "backend")) or \
                    (isinstance(owner, ast.Attribute) and owner.attr in ("rows", "modules_backend")) or \
                    (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Attribute) and owner.func.attr == "backend_for"):
                called.add(node.func.attr)
    assert called, "the drafter no longer calls a backend: update this test and drafter/backend.py"
    assert called <= declared, f"drafter/model.py calls {sorted(called - declared)} on a backend, not in DraftBackend"


def test_both_draft_backends_implement_the_protocol_with_its_parameters():
    from sglang_dspark.drafter.backend import DraftBackend, ModuleBackend
    from sglang_dspark.engine.cpu.draft_rows import DraftRows

    for backend in (DraftRows, ModuleBackend):
        for name, sig in _protocol_methods(DraftBackend).items():
            assert hasattr(backend, name), f"{backend.__name__} lacks {name}"
            got = inspect.signature(inspect.unwrap(getattr(backend, name)))
            assert list(got.parameters) == list(sig.parameters), (backend.__name__, name, got, sig)


def test_greedy_drafting_is_a_property_of_the_sampler():
    from sglang_dspark.drafter.sampling import argmax_sampler, greedy_sampler, is_argmax

    assert is_argmax(argmax_sampler) and not is_argmax(greedy_sampler)
    assert not is_argmax(lambda logits, k: argmax_sampler(logits + 1.0, k))  # a wrapper is not
    source = (PACKAGE / "drafter" / "model.py").read_text()
    assert "is argmax_sampler" not in source and "is_argmax(sampler)" in source


# ---- the CPU wing: engine/cpu/ owns every weight format and kernel ------------------------------

WING = PACKAGE / "engine" / "cpu"
# what the rest of the package may import from the wing: the format object and its names, and the
# row kernels' limits and decoder layer, which the target's family layer holds as ops
WING_FACADE = {"formats", "names", "limits", "row_layer"}


def _format_names() -> set[str]:
    from sglang_dspark.engine.cpu.names import WEIGHT_FORMATS

    return set(WEIGHT_FORMATS) - {"float32"}  # float32 is also a dtype's name, the checkpoint's own


def _kernel_names() -> set[str]:
    """The row kernels' op names (TORCH_LIBRARY defs in cpu_rows.cpp) and aten's weight-only kernels."""
    source = (WING / "cpu_rows.cpp").read_text()
    ops = set(re.findall(r'm\.def\("(\w+)\(', source)) | set(re.findall(r'm\.impl\("(\w+)"', source))
    assert {"q4_rows_mm", "rows_attention"} <= ops, "cpu_rows.cpp's op registrations moved: update this test"
    return ops | {"_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu"}


def wing_violations(path: Path, source: str) -> list[str]:
    """Where a module outside engine/cpu/ names a weight format in a comparison or a table, calls or
    names a kernel, or imports the wing's insides."""
    formats, kernels, out = _format_names(), _kernel_names(), []

    def literals(node):
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    for node in ast.walk(ast.parse(source)):
        where = f"{path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Compare) and literals(node) & formats:
            out.append(f"{where}: compares against {sorted(literals(node) & formats)}")
        elif isinstance(node, ast.Dict) and {k.value for k in node.keys if isinstance(k, ast.Constant)} & formats:
            out.append(f"{where}: a table keyed by format")
        elif isinstance(node, ast.Attribute) and node.attr in kernels:
            out.append(f"{where}: names the kernel {node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang_dspark.engine.cpu"):
            inner = {node.module.removeprefix("sglang_dspark.engine.cpu").lstrip(".")} - {""}
            inner |= {a.name for a in node.names} if not inner else set()
            if inner - WING_FACADE:
                out.append(f"{where}: imports engine/cpu's {sorted(inner - WING_FACADE)}")
    return out


def test_nothing_outside_the_cpu_wing_names_a_weight_format_or_a_kernel():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if WING not in path.parents:
            violations += wing_violations(path.relative_to(ROOT), path.read_text())
    assert not violations, "\n".join(violations)


def test_the_wing_rule_fails_on_a_format_branch_a_kernel_call_or_an_inner_import():
    """The rule above can fail: each of these, added to a module outside the wing, is caught."""
    cases = {
        'if fmt in ("int8", "int4"):\n    pass\n': "compares against",
        'if weight_format == "bfloat16":\n    pass\n': "compares against",
        'ULPS = {"int4": 4.0}\n': "keyed by format",
        'y = ops.q4_rows_mm(x, w, s)\n': "names the kernel",
        'y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, w, 32, s)\n': "names the kernel",
        'from sglang_dspark.engine.cpu.quantized_linear import Int4Linear\n': "imports engine/cpu's",
        'from sglang_dspark.engine.cpu import cpu_rows\n': "imports engine/cpu's",
    }
    for source, message in cases.items():
        found = wing_violations(Path("sglang_dspark/engine/engine.py"), source)
        assert found and message in found[0], (source, found)
    assert not wing_violations(Path("x.py"), 'fmt = WeightFormat.of(name)\nif fmt.quantized:\n    pass\n')


def test_no_context_variable_decides_a_kernel():
    """Which kernel runs is the caller's explicit choice (the format object, `prompt=True`), never a
    switch set around the call."""
    users = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if "ContextVar" in p.read_text()]
    assert not users, users
