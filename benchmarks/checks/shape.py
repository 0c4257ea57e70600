"""``grpo-bench check shape``: the code's shape at two git revisions, side by side (issue #46: the import graph
before and after, "no cycle, no arrow up, checks/ and perf/ side by side"; the longest functions and the largest
modules before and after).

The import graph is read here and nowhere else: tests/test_layout.py enforces the layering on the working tree with
these functions and this module's rules, and the report reads each revision with the same ones, so what the tests
refuse and what the report counts cannot drift apart. Every reader takes the sources as text (a module's name ->
its source), so a revision read with ``git show REV:path`` and the files on disk go through the same code.

What counts as an import (as the layering tests have always read it): every ``import X`` and absolute ``from X
import Y`` statement, at module level or inside a function (a function-local import still ties the two modules
together; it only defers the cost), resolved to the longest project module it names; ``from pkg import sub`` names
the submodule where there is one. Relative imports are not read (the project has none). An arrow is a pair of
modules, importer and imported; it is "function-local" when every import behind it sits inside a function.
"""

from __future__ import annotations

import ast
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Iterator, Optional

from benchmarks.errors import UsageError
from benchmarks.git import git, resolve
from benchmarks.io import atomic_write_json
from benchmarks.markdown import markdown_table
from benchmarks.study import StudySettings, option

# --- the layering: the packages read, and the rules the tests enforce -----------------------------------------------

PACKAGES = ("algorithms", "tasks", "benchmarks")
# What the report may read: its own modules, run files (io, the store), the markdown writer beside io, and the git
# history the cells' recorded commits are looked up in.
REPORT_READS = ("benchmarks.report", "benchmarks.io", "benchmarks.markdown", "benchmarks.errors", "benchmarks.store",
                "benchmarks.curve", "benchmarks.git")
# The layers the report sits on, beside the command line: none of them imports it.
BELOW_THE_REPORT = ("benchmarks.harness", "benchmarks.matrix", "benchmarks.checks", "benchmarks.perf", "algorithms", "tasks")
# Correctness checks and performance benches stand side by side: what both need lives in benchmarks/references/.
SIDE_BY_SIDE = ("benchmarks.checks", "benchmarks.perf")
COMMAND_LINE = "benchmarks.cli"


def within(name: str, packages: tuple[str, ...]) -> bool:
    """``name`` is one of ``packages`` or a module inside one."""
    return any(name == p or name.startswith(p + ".") for p in packages)


# Each rule: its name -> whether the arrow importer -> imported breaks it. The tests hold each one empty on the working
# tree (tests/test_layout.py); the report counts them at each revision.
RULES = {
    "algorithms/ and tasks/ stand alone": lambda a, b: any(
        within(a, (p,)) and not within(b, (p,)) for p in ("algorithms", "tasks")),
    "nothing imports the command line": lambda a, b: (
        b == f"{COMMAND_LINE}.main" or (within(b, (COMMAND_LINE,)) and not within(a, (COMMAND_LINE,)))),
    "the report reads run data only": lambda a, b: within(a, ("benchmarks.report",)) and not within(b, REPORT_READS),
    "nothing below the report imports it": lambda a, b: (
        within(a, BELOW_THE_REPORT) and within(b, ("benchmarks.report",))),
    "checks/ and perf/ side by side": lambda a, b: any(
        within(a, (x,)) and within(b, (y,)) for x, y in (SIDE_BY_SIDE, SIDE_BY_SIDE[::-1])),
}


# --- the sources: the working tree or a revision, as {path: text} and {module: text} ---------------------------------


def module_name(path: str) -> str:
    """'benchmarks/checks/shape.py' -> 'benchmarks.checks.shape'; a package's __init__.py is the package."""
    parts = list(Path(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(files: dict[str, str]) -> dict[str, str]:
    """{path: source} -> {module name: source}."""
    return {module_name(path): source for path, source in files.items()}


def working_tree_files(root: Path) -> dict[str, str]:
    """Every .py file of the packages under ``root`` as it is on disk: {path relative to root: source}."""
    return {p.relative_to(root).as_posix(): p.read_text()
            for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}


def revision_files(repo: str, commit: str) -> dict[str, str]:
    """Every .py file of the packages at ``commit`` (``git ls-tree``, then ``git show COMMIT:path`` each)."""
    listed = git(repo, "ls-tree", "-r", "-z", "--name-only", "--full-tree", commit).decode().split("\0")
    paths = sorted(p for p in listed if p.endswith(".py") and p.split("/")[0] in PACKAGES)
    return {p: git(repo, "show", f"{commit}:{p}").decode(errors="replace") for p in paths}


# --- the import graph -------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Import:
    """One import statement's arrow to one project module."""

    importer: str
    imported: str
    local: bool  # inside a function: runs when the function is called, not when the module is imported
    line: int


def resolve_import(name: str, modules: dict) -> Optional[str]:
    """The project module an import statement names (the longest known prefix), or None for a library."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def _import_statements(tree: ast.AST) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement of ``tree``, with whether it sits inside a function."""

    def walk(node: ast.AST, local: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, local
            yield from walk(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    return walk(tree, False)


def imported_names(source: str) -> set[str]:
    """Every module an import statement of ``source`` names, libraries included (the argparse and framework rules)."""
    names = set()
    for node, _ in _import_statements(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif node.module and node.level == 0:
            names.add(node.module)
    return names


def project_imports(modules: dict[str, str]) -> list[Import]:
    """Every arrow of an import statement to another project module (a statement naming one module twice, once)."""
    found = []
    for name, source in modules.items():
        for node, local in _import_statements(ast.parse(source, filename=name)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.module and node.level == 0:
                # `from pkg import sub` names the submodule when there is one, else the package
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                continue
            resolved = {t for t in (resolve_import(x, modules) for x in targets) if t and t != name}
            found += [Import(name, t, local, node.lineno) for t in sorted(resolved)]
    return found


def import_graph(modules: dict[str, str], imports: Optional[list[Import]] = None) -> dict[str, set[str]]:
    """Every module -> the project modules it imports, function-level imports included."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for i in project_imports(modules) if imports is None else imports:
        graph[i.importer].add(i.imported)
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` reaches through one or more arrows (itself only when it sits on a cycle)."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _shortest_cycle(graph: dict[str, set[str]], start: str, knot: set[str]) -> list[str]:
    """The shortest path from ``start`` back to itself inside its knot (breadth first), ``[start, ..., start]``."""
    came_from: dict[str, Optional[str]] = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            if start in graph.get(node, ()):
                path = [node]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return path[::-1] + [start]
            for nxt in sorted(graph.get(node, set()) & knot):
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise ValueError(f"{start} is on no cycle")


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per knot of the graph (modules that each reach every other through imports): the shortest path from
    the knot's first module back to itself, ``[a, b, ..., a]``; empty when there is no cycle. One per knot rather than
    every cycle, so that the count is of tangles to undo (one knot of n modules may hold very many cycles)."""
    reach = {node: _reachable(graph, node) for node in graph}
    knots: list[set[str]] = []
    for node in sorted(graph):
        if node in reach[node] and not any(node in knot for knot in knots):
            knots.append({node} | {m for m in reach[node] if node in reach.get(m, ())})
    return [_shortest_cycle(graph, min(knot), knot) for knot in knots]


def broken_rules(graph: dict[str, set[str]]) -> dict[str, list[tuple[str, str]]]:
    """Each rule of RULES -> the arrows (importer, imported) that break it, sorted; an empty list: kept."""
    arrows = sorted((a, b) for a, targets in graph.items() for b in targets)
    return {rule: [(a, b) for a, b in arrows if breaks(a, b)] for rule, breaks in RULES.items()}


# --- the shape: rooms, sizes, functions -------------------------------------------------------------------------------

# The rooms in the order the tables show them, the bottom first; a room a revision has beyond these follows.
ROOMS = ("algorithms", "tasks", "benchmarks", "benchmarks.harness", "benchmarks.matrix", "benchmarks.references",
         "benchmarks.checks", "benchmarks.perf", "benchmarks.report", "benchmarks.suites", "benchmarks.cli")
TOP_FUNCTIONS = TOP_MODULES = 10
LONG = (60, 40)  # the function lengths counted


def room(path: str) -> str:
    """A module's room: its top package plus its sub-package ('benchmarks/checks/cases/verl.py' ->
    'benchmarks.checks'); algorithms/ and tasks/ are one room each, and benchmarks/'s own modules are 'benchmarks'."""
    parts = Path(path).parts
    return ".".join(parts[:2]) if parts[0] == "benchmarks" and len(parts) > 2 else parts[0]


def _room_order(name: str) -> tuple:
    return (ROOMS.index(name), "") if name in ROOMS else (len(ROOMS), name)


def functions(source: str, filename: str = "<source>") -> list[tuple[str, int, int]]:
    """Every function and method of ``source``: (qualified name as Python writes it, first line, lines from its
    ``def`` to its last line). Nested ones count on their own as well as inside the function around them."""
    found = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child.lineno, child.end_lineno - child.lineno + 1))
                walk(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(source, filename=filename), "")
    return found


def room_edges(imports: list[Import], room_of: dict[str, str], breaking: set) -> list[dict]:
    """The arrows between rooms: per pair of rooms, the module pairs behind it, module-level (any of a pair's imports
    at module level) and function-local (all of them inside functions) counted apart, how many break a rule, and the
    importing modules. Arrows inside a room are not counted."""
    module_level: dict[tuple[str, str], bool] = {}
    for i in imports:
        module_level[(i.importer, i.imported)] = module_level.get((i.importer, i.imported), False) or not i.local
    between, importers = Counter(), {}
    for (a, b), top in module_level.items():
        if room_of[a] != room_of[b]:
            between[(room_of[a], room_of[b], "module_level" if top else "function_local")] += 1
            between[(room_of[a], room_of[b], "breaking")] += (a, b) in breaking
            importers.setdefault((room_of[a], room_of[b]), set()).add(a)
    pairs = sorted(importers, key=lambda p: (_room_order(p[0]), _room_order(p[1])))
    kinds = ("module_level", "function_local", "breaking")
    return [{"from": a, "to": b, **{kind: between[(a, b, kind)] for kind in kinds},
             "importers": sorted(importers[a, b])} for a, b in pairs]


def measure(files: dict[str, str]) -> dict:
    """The shape of one tree ({path: source}): rooms and the arrows between them, the layering's verdicts, sizes and
    the longest functions."""
    by_module = modules(files)
    room_of = {module_name(path): room(path) for path in files}
    try:
        imports = project_imports(by_module)
        lengths = sorted(((path, *f) for path, source in files.items() for f in functions(source, path)),
                         key=lambda f: (-f[3], f[0], f[2]))
    except SyntaxError as exc:
        raise UsageError(f"{exc.filename}: Python this interpreter cannot parse ({exc.msg}, line {exc.lineno})"
                         ) from None
    graph = import_graph(by_module, imports)
    rules = broken_rules(graph)
    lines = {path: len(source.splitlines()) for path, source in files.items()}
    return {
        "modules": len(files),
        "lines": sum(lines.values()),
        "functions": len(lengths),
        "rooms": [{"room": r, "modules": sum(room(p) == r for p in files),
                   "lines": sum(n for p, n in lines.items() if room(p) == r)}
                  for r in sorted(set(room_of.values()), key=_room_order)],
        "room_edges": room_edges(imports, room_of, {arrow for arrows in rules.values() for arrow in arrows}),
        "cycles": find_cycles(graph),
        # a list, not a mapping: the json's keys are sorted, and the report keeps RULES' order
        "rules": [{"rule": rule, "arrows": [list(arrow) for arrow in arrows]} for rule, arrows in rules.items()],
        "local_imports": sum(i.local for i in imports),
        "largest_modules": [{"path": p, "lines": n} for p, n in sorted(lines.items(), key=lambda x: (-x[1], x[0]))
                            ][:TOP_MODULES],
        "longest_functions": [{"path": p, "function": name, "line": line, "lines": n}
                              for p, name, line, n in lengths[:TOP_FUNCTIONS]],
        "functions_over": {str(limit): sum(f[3] > limit for f in lengths) for limit in LONG},
    }


# --- the study --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ShapeSettings(StudySettings):
    before: str = dataclasses.field(default="e56a20c", metadata={
        "help": "the git revision to compare against (default: e56a20c, the last commit before issue #46's work)"})
    after: str = dataclasses.field(default="HEAD", metadata={"help": "the git revision measured against it"})
    repo: str = dataclasses.field(default=".", metadata={"help": "the git checkout the revisions belong to"})
    out: str = option("out", "results/shape")  # report.md and shape.json
    readme: str = option("readme", "", shown="none")
    rerender: bool = option("rerender")


def compare(settings: ShapeSettings, command: str) -> dict:
    """Both revisions resolved (an unknown one is one UsageError line before anything is read), then measured."""
    revisions = [resolve(settings.repo, r) for r in (settings.before, settings.after)]
    return {"command": command, "revisions": revisions,
            "shapes": [measure(revision_files(settings.repo, r["commit"])) for r in revisions]}


def run_shape_check(settings: ShapeSettings, command: str, source: Path) -> dict:
    """The comparison, kept as ``source`` (the json --rerender renders from)."""
    result = compare(settings, command)
    atomic_write_json(source, result)
    return result


def broken_count(shape: dict) -> int:
    return sum(len(r["arrows"]) for r in shape["rules"])


def passed(result: dict) -> bool:
    """The later revision has no cycle and no arrow that breaks a rule (the earlier one is what it is compared to)."""
    after = result["shapes"][-1]
    return not after["cycles"] and not broken_count(after)


def _short(revision: dict) -> str:
    return f"`{revision['commit'][:8]}`"


def _node(name: str) -> str:
    return name.replace(".", "_")


def mermaid(shape: dict) -> str:
    """The rooms as a mermaid flowchart, each importer above what it imports: an arrow per pair of rooms, labelled
    with the pairs of modules behind it; dashed where every one of them is function-local; red where one breaks a
    rule."""
    lines = ["```mermaid", "flowchart TD"]
    lines += [f'  {_node(r["room"])}["{r["room"]}"]' for r in shape["rooms"]]
    red = []
    for i, e in enumerate(shape["room_edges"]):
        arrow = "-->" if e["module_level"] else "-.->"
        lines.append(f'  {_node(e["from"])} {arrow}|{e["module_level"] + e["function_local"]}| {_node(e["to"])}')
        if e["breaking"]:
            red.append(str(i))
    if red:
        lines.append(f"  linkStyle {','.join(red)} stroke:#d00,stroke-width:3px")
    lines.append("```")
    return "\n".join(lines)


def _arrows(shape: dict) -> list[str]:
    """The cycles and the arrows that break a rule, one bullet each."""
    found = [f"- cycle: {' -> '.join(f'`{m}`' for m in cycle)}" for cycle in shape["cycles"]]
    for r in shape["rules"]:
        found += [f"- {r['rule']}: `{a}` -> `{b}`" for a, b in r["arrows"]]
    return found


def render(result: dict) -> str:
    """The report below its title: the headline, the layering, the rooms' graphs, the sizes, and the command."""
    before, after = result["revisions"]
    old, new = result["shapes"]
    biggest = [s["largest_modules"][0] for s in (old, new)]
    over = str(LONG[0])
    lines = [
        f"**{_short(before)} -> {_short(after)}: import cycles {len(old['cycles'])} -> {len(new['cycles'])}; arrows "
        f"that break a layering rule {broken_count(old)} -> {broken_count(new)}; functions over {over} lines "
        f"{old['functions_over'][over]} -> {new['functions_over'][over]}; largest module `{biggest[0]['path']}` "
        f"{biggest[0]['lines']:,} lines -> `{biggest[1]['path']}` {biggest[1]['lines']:,}.**",
        "",
        f"Before: {_short(before)} ({before['revision']}), {before['subject']}",
        "",
        f"After: {_short(after)} ({after['revision']}), {after['subject']}",
        "",
        "Every .py file under algorithms/, tasks/ and benchmarks/ at each revision (`git ls-tree`, `git show`), read "
        "with `ast` by benchmarks/checks/shape.py, whose import graph and rules tests/test_layout.py enforces on the "
        "working tree. An import is any `import` or absolute `from ... import` of a project module, at module level "
        "or inside a function; an arrow is a pair of modules, function-local when every import of it sits inside a "
        "function. A module's room is its top package and sub-package (benchmarks/'s own modules: `benchmarks`).",
        "",
    ]
    lines += _layering(result) + _rooms(result) + _sizes(result)
    lines.append(f"Regenerate: `{result['command']}` (before was `{before['commit']}`, after `{after['commit']}`)")
    return "\n".join(lines) + "\n"


def _layering(result: dict) -> list[str]:
    """The verdicts at each revision, counted, then every cycle and broken arrow named."""
    revisions, (old, new) = result["revisions"], result["shapes"]
    lines = ["## The layering", "",
             "An import cycle is a knot: modules that each reach every other through imports (one cycle listed for "
             "each).", ""]
    rows = [["import cycles", len(old["cycles"]), len(new["cycles"])]]
    counts = [{r["rule"]: len(r["arrows"]) for r in s["rules"]} for s in (old, new)]
    rows += [[f"arrows that break: {rule}", counts[0].get(rule, "-"), counts[1].get(rule, "-")]
             for rule in dict.fromkeys([*counts[1], *counts[0]])]
    rows += [["function-local imports of the project's own modules (statement x module)", old["local_imports"],
              new["local_imports"]]]
    lines += [markdown_table(["", *map(_short, revisions)], rows), ""]
    for revision, shape in zip(revisions, result["shapes"]):
        found = _arrows(shape)
        lines += [f"At {_short(revision)}: " + (f"{len(found)} found:" if found else
                                                 "no cycle and no arrow that breaks a rule."), ""]
        lines += found + [""] if found else []
    return lines


def _rooms(result: dict) -> list[str]:
    """Each revision's graph of rooms, drawn and tabled."""
    lines = ["## The rooms and the arrows between them", "",
             "Each importer above what it imports; an arrow's label is the number of module pairs behind it, dashed "
             "where every one of them is function-local, red where one breaks a rule. The table names the importing "
             "modules within their room. `benchmarks` is benchmarks/'s own modules: the bottom (errors, io, markdown, "
             "store, ...) but also entry points that stand above it (the Python API, the top-level studies); its "
             "arrows to the rooms above are theirs.", ""]
    for revision, shape in zip(result["revisions"], result["shapes"]):
        rows = [[f"`{e['from']}`", f"`{e['to']}`", e["module_level"], e["function_local"], e["breaking"],
                 _importers(e)] for e in shape["room_edges"]]
        lines += [f"### {_short(revision)}", "", mermaid(shape), "",
                  markdown_table(["from", "to", "module-level", "function-local", "breaking a rule", "importers"],
                                 rows), ""]
    return lines


def _importers(edge: dict, shown: int = 4) -> str:
    """The importing modules of a room's arrow, by their names within the room, the first ``shown`` of them."""
    names = [m[len(edge["from"]) + 1:] if m.startswith(edge["from"] + ".") else m for m in edge["importers"]]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _sizes(result: dict) -> list[str]:
    """Lines and functions: totals, per room, the largest modules and the longest functions side by side."""
    heads = [_short(r) for r in result["revisions"]]
    old, new = result["shapes"]
    rows = [["modules", old["modules"], new["modules"]], ["lines of Python", f"{old['lines']:,}", f"{new['lines']:,}"],
            ["functions and methods", f"{old['functions']:,}", f"{new['functions']:,}"]]
    rows += [[f"functions over {limit} lines", old["functions_over"][str(limit)], new["functions_over"][str(limit)]]
             for limit in LONG]
    lines = ["## Size", "", markdown_table(["", *heads], rows), "", "### Lines per room", ""]
    sizes = [{r["room"]: r for r in s["rooms"]} for s in (old, new)]
    rows = []
    for name in sorted(set(sizes[0]) | set(sizes[1]), key=_room_order):
        was, now = (s.get(name, {"modules": 0, "lines": 0}) for s in sizes)
        rows.append([f"`{name}`", was["modules"], f"{was['lines']:,}", now["modules"], f"{now['lines']:,}",
                     f"{now['lines'] - was['lines']:+,}"])
    lines += [markdown_table(["room", f"modules {heads[0]}", f"lines {heads[0]}", f"modules {heads[1]}",
                              f"lines {heads[1]}", "change"], rows), ""]
    for title, key, name in ((f"The {TOP_MODULES} largest modules", "largest_modules", lambda m: f"`{m['path']}`"),
                             (f"The {TOP_FUNCTIONS} longest functions", "longest_functions",
                              lambda f: f"`{f['function']}` (`{f['path']}:{f['line']}`)")):
        rows = [[k + 1] + [cell for s in (old, new) for cell in _ranked(s[key], k, name)]
                for k in range(max(len(old[key]), len(new[key])))]
        lines += [f"### {title}", ""]
        if key == "longest_functions":
            lines += ["Lines from the `def` to the function's last line (decorators not counted); a nested function "
                      "counts on its own too.", ""]
        lines += [markdown_table(["#", heads[0], "lines", heads[1], "lines"], rows), ""]
    return lines


def _ranked(entries: list[dict], k: int, name) -> list:
    """The name and lines of the k-th entry, or two blanks where a tree has fewer."""
    return [name(entries[k]), f"{entries[k]['lines']:,}"] if k < len(entries) else [None, None]
