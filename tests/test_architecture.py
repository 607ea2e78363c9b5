"""The package's import graph draws the design: layers only import downward, no cycles, no private
names across modules, the product never reaches into developer tooling, Spark stays in ``spark/``,
PyIceberg's internals are reached through one door (the package ``pyiceberg_internals``) only, no
module grows past its size. The tooling, the tests' helpers and the tests use the product by its
public names and reach PyIceberg's internals through the door too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fanout_sink"

# Bottom to top. A module may import its own layer and the layers below it, never one above.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "faults", "processes", "logs", "user_info", "retries", "refused_imports"),
    # pyiceberg_internals: the one door to PyIceberg's internals, a package of one concern per module;
    # below transform and protocol, which use it; its FileIO builds on durable_io beside it.
    ("kafka", "catalog", "catalog_errors", "durable_io", "pyiceberg_internals", "avro_schema", "jars"),
    ("config",),
    ("transform",),
    ("protocol",),
    ("maintenance",),
    ("spark", "status", "consistent_read", "preflight", "metrics", "validate", "connect_import", "route"),
    ("devtools",),
    # The composition root: the one command offers product and developer tooling alike, and
    # spark-submit's entry is that command's ``run``.
    ("cli", "submit"),
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
SPARK_USERS = ("fanout_sink.spark", "fanout_sink.devtools")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
TOOLING_ROOT = PACKAGE.parent / "tests"
TOOLING = ("bench", "chaos")
"""Developer tooling outside the package (``tests/bench``, ``tests/chaos``): importable with ``tests/``
on the path, never from the package, which a wheel or the executors' pack holds without it."""
TOOLING_MODULES = {
    ".".join(path.relative_to(TOOLING_ROOT).with_suffix("").parts): path
    for unit in TOOLING
    for path in sorted((TOOLING_ROOT / unit).rglob("*.py"))
}
TEST_SOURCES = {
    str(path.relative_to(TOOLING_ROOT.parent)): path
    for path in sorted(
        {
            *(TOOLING_ROOT / "support").rglob("*.py"),
            *TOOLING_ROOT.rglob("test_*.py"),
            *TOOLING_ROOT.rglob("conftest.py"),
        }
    )
    if ".venv" not in path.parts
}
"""The tests' helpers (``tests/support``), the test modules and their ``conftest.py``: held to the rules
on names the tooling is held to, so that a renamed private helper or a PyIceberg upgrade breaks them
no more than it breaks a user of the package."""


def _imports(name: str) -> Iterator[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import in a module, nested ones too."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module in MODULES and all(f"{node.module}.{a.name}" in MODULES for a in node.names):
                for alias in node.names:  # `from fanout_sink.kafka import client`: a module import
                    yield f"{node.module}.{alias.name}", [], node.lineno
            else:
                yield node.module, [alias.name for alias in node.names], node.lineno


def _internal_edges() -> dict[str, set[str]]:
    return {
        name: {target for target, _, _ in _imports(name) if target in MODULES and target != name}
        for name in MODULES
    }


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = sorted({_unit(m) for m in MODULES} - set(RANK) - {"", "bootstrap"})
    assert not unplaced, f"place these in LAYERS (or rethink where they live): {unplaced}"


def test_layers_only_import_downward() -> None:
    upward = [
        f"{source} -> {target}"
        for source, targets in _internal_edges().items()
        if _unit(source) in RANK
        for target in targets
        if _unit(target) in RANK and RANK[_unit(target)] > RANK[_unit(source)]
    ]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_the_import_graph_has_no_cycles() -> None:
    edges = _internal_edges()
    state: dict[str, int] = {}  # 1 visiting, 2 done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for an expression made of names and attributes only, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _private_names_taken(path: Path) -> Iterator[str]:
    """Private names of ``fanout_sink`` modules a source file takes ("line N ..."): imported, read or
    set as an attribute of a module (``mod._x``, ``fanout_sink.mod._x``), named as a string to
    ``setattr``, ``getattr``, ``monkeypatch.setattr`` and the like (``setattr(mod, "_x", ...)``), or by
    a dotted path (``monkeypatch.setattr("fanout_sink.mod._x", ...)``, ``mock.patch(...)``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules_here: dict[str, str] = {}  # local name -> the fanout_sink module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fanout_sink"):
            for alias in node.names:
                if _private(alias.name):
                    yield f"line {node.lineno} imports {node.module}.{alias.name}"
                if f"{node.module}.{alias.name}" in MODULES:
                    modules_here[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    root = alias.asname or alias.name.split(".")[0]
                    modules_here[root] = alias.name if alias.asname else root

    def module(expr: ast.expr) -> str | None:
        dotted = _dotted(expr)
        if dotted is None or dotted.split(".")[0] not in modules_here:
            return None
        head, _, rest = dotted.partition(".")
        full = ".".join(filter(None, [modules_here[head], rest]))
        return full if full in MODULES else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and module(node.value) is not None:
            yield f"line {node.lineno} uses {ast.unparse(node)}"
        elif isinstance(node, ast.Call) and node.args:
            first, *rest = node.args
            named = rest[0] if rest else None
            if (
                isinstance(named, ast.Constant)
                and isinstance(named.value, str)
                and _private(named.value)
                and module(first) is not None
            ):
                yield f"line {node.lineno} names {ast.unparse(first)}.{named.value}"
            elif (
                isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.startswith("fanout_sink.")
                and any(_private(part) for part in first.value.split("."))
            ):
                yield f"line {node.lineno} names {first.value}"


def test_no_private_name_crosses_a_module() -> None:
    """Nor does the developer tooling outside the package, the tests' helpers or a test take one: they
    use the product as a user of its public names would. A name a test needs is part of the module's
    interface, and public."""
    crossing = [
        f"{name}: {use}"
        for name, path in {**MODULES, **TOOLING_MODULES, **TEST_SOURCES}.items()
        for use in _private_names_taken(path)
    ]
    assert not crossing, "\n".join(crossing)
    assert TEST_SOURCES, "the check no longer sees the tests"


def test_the_package_never_imports_the_tooling_outside_it() -> None:
    """The benchmarks, the chaos runner and the tests' helpers live in ``tests/``: an installed wheel
    does not have them, so an import of one from the package would fail there."""
    outside = {*TOOLING, "support", "tests"}
    found = [
        f"{name}:{line} imports {target}"
        for name in MODULES
        for target, _, line in _imports(name)
        if target.split(".")[0] in outside
    ]
    assert not found, "\n".join(found)
    assert TOOLING_MODULES, "the check no longer sees the tooling"


def test_bootstrap_needs_nothing_but_the_standard_library() -> None:
    """It runs on a fresh machine before anything is installed."""
    import sys

    foreign = [
        t for t, _, _ in _imports("fanout_sink.bootstrap") if t.split(".")[0] not in sys.stdlib_module_names
    ]
    assert not foreign, foreign


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith(SPARK_USERS)))
def test_only_the_spark_layer_imports_pyspark(module: str) -> None:
    """Workers, the coordinator and routing run and are tested without a Spark session."""
    spark = [
        f"line {line}" for target, _, line in _imports(module) if target.split(".")[0] in ("pyspark", "py4j")
    ]
    assert not spark, f"{module} imports pyspark at {spark}"


CLIENT_FACTORY = "fanout_sink.kafka.clients"
KAFKA_CLIENTS = ("Consumer", "Producer", "AdminClient")


def _client_constructions(name: str) -> Iterator[str]:
    """Calls of confluent-kafka's client constructors in a module, however they were imported
    (``from confluent_kafka import Consumer as C``, ``confluent_kafka.admin.AdminClient(...)``)."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    local: dict[str, str] = {}  # local name -> constructor
    modules: set[str] = set()  # local names bound to confluent_kafka modules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "confluent_kafka":
            for alias in node.names:
                if alias.name in KAFKA_CLIENTS:
                    local[alias.asname or alias.name] = alias.name
                elif alias.name in ("admin", "cimpl"):
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update(
                (a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("confluent_kafka")
            )
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in local:
            yield f"{name}:{node.lineno} calls {local[func.id]}("
        elif isinstance(func, ast.Attribute) and func.attr in KAFKA_CLIENTS:
            root = func.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules:
                yield f"{name}:{node.lineno} calls {func.attr}("


def test_kafka_clients_are_made_only_by_the_factory() -> None:
    """One home for client properties, logging and timeouts: ``KafkaClientFactory``. A constructor
    called elsewhere would make a client without the sink's logger, error callback or settings."""
    elsewhere = [found for name in MODULES if name != CLIENT_FACTORY for found in _client_constructions(name)]
    assert not elsewhere, "make these clients through KafkaClientFactory:\n" + "\n".join(elsewhere)
    assert list(_client_constructions(CLIENT_FACTORY)), "the check no longer sees the factory's own calls"


PYICEBERG_DOOR = "fanout_sink.pyiceberg_internals"
"""The one package that extends PyIceberg or reaches into its internals, one concern per module."""
DOOR_MODULES = {name: path for name, path in MODULES.items() if _unit(name) == _unit(PYICEBERG_DOOR)}


def _root(node: ast.expr) -> str | None:
    """The name an expression like ``a.b[c].d`` starts from."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _pyiceberg_internals_used(path: Path) -> Iterator[str]:
    """Private PyIceberg names imported, private attributes of names imported from PyIceberg used, and
    classes subclassing one of those names, in one source file ("line N ...")."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imported: set[str] = set()  # local names bound to PyIceberg modules, classes, functions
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pyiceberg":
            private_module = any(_private(part) for part in (node.module or "").split("."))
            for alias in node.names:
                if private_module or _private(alias.name):
                    yield f"line {node.lineno} imports {node.module}.{alias.name}"
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "pyiceberg":
                    if any(_private(part) for part in alias.name.split(".")):
                        yield f"line {node.lineno} imports {alias.name}"
                    imported.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _root(node.value) in imported:
            yield f"line {node.lineno} uses {ast.unparse(node)}"
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                if _root(base) in imported:
                    yield f"line {node.lineno} subclasses {ast.unparse(base)} ({node.name})"


def test_only_the_door_reaches_into_pyiceberg_internals() -> None:
    """A PyIceberg upgrade may change any private name or any class the sink extends: all of them are
    in the package ``fanout_sink/pyiceberg_internals/``, so an upgrade breaks the sink in that one
    place, whose modules list what they reach into. Developer tooling under ``tests/``, the tests'
    helpers and the tests are held to the same rule: a test that reached in would fail with an
    upgrade for a reason of its own. Every module of the door reaches into something: one that does
    not belongs outside."""
    sources = {
        **{name: path for name, path in MODULES.items() if name not in DOOR_MODULES},
        **TOOLING_MODULES,
        **TEST_SOURCES,
    }
    found = [f"{name}: {use}" for name, path in sources.items() for use in _pyiceberg_internals_used(path)]
    assert not found, f"reach PyIceberg's internals through {PYICEBERG_DOOR} only:\n" + "\n".join(found)
    idle = [
        name
        for name, path in DOOR_MODULES.items()
        if name != PYICEBERG_DOOR and not list(_pyiceberg_internals_used(path))
    ]
    assert not idle, f"these reach into nothing of PyIceberg's; move them out of the door: {idle}"
    assert len(DOOR_MODULES) > 1, "the check no longer sees the door's modules"


MAX_LINES = 600
MAX_PROTOCOL_LINES = 450
"""The exactly-once protocol's modules are read line by line when a guarantee is in question."""


def test_no_module_outgrows_its_size() -> None:
    """A module past these sizes has grown a second job (issue 46 item 5): split it by concern."""
    over = []
    for name, path in MODULES.items():
        limit = MAX_PROTOCOL_LINES if name.startswith("fanout_sink.protocol.") else MAX_LINES
        if (lines := len(path.read_text().splitlines())) > limit:
            over.append(f"{name}: {lines} lines (at most {limit})")
    assert not over, "\n".join(over)


RECOVERY = "fanout_sink.protocol.recovery"
COORDINATOR = "fanout_sink.protocol.coordinator"
GROUP_LAYOUT = "fanout_sink.protocol.group_layout"
"""Commits one offset of its own layout group (never the sink group's): the partition-group layout
and the start that recorded it, in a transaction of the layout transactional id."""
OFFSET_SENDERS = {
    # The transactional envelope implements send_offsets with it; nothing else calls librdkafka's.
    "send_offsets_to_transaction": {"fanout_sink.kafka.transaction"},
    # The sink group through recovery; the coordinator's own group (its low watermark) in its round;
    # the layout group's record (its group metadata only, checked below).
    "send_offsets": {RECOVERY, COORDINATOR, GROUP_LAYOUT},
    # Group metadata is made by the client factory only (``group_metadata``), checked below.
    "consumer_group_metadata": {CLIENT_FACTORY},
    # Nobody commits or alters offsets any other way.
    "store_offsets": set(),
    "alter_consumer_group_offsets": set(),
}


def _calls(name: str) -> Iterator[tuple[str, ast.Call]]:
    """(called attribute or function name, call) for every call in a module."""
    for node in ast.walk(ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))):
        if isinstance(node, ast.Call):
            func = node.func
            called = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            yield called, node


def test_only_the_recovery_module_writes_the_sink_groups_offsets() -> None:
    """The sink group is the truth about what was delivered (I1): one module writes it, so a change
    to exactly-once behaviour has one place to look. An offset commit needs group metadata and a
    send; the metadata of any group but the coordinator's and the layout group's is made only in
    recovery, offsets are sent only by recovery, by the coordinator (which holds its own group's
    metadata only) and by the layout record's commit to its own group, and no consumer commits or
    stores offsets."""
    found = []
    for name in MODULES:
        for called, call in _calls(name):
            where = f"{name}:{call.lineno} calls {called}("
            if called in OFFSET_SENDERS and name not in OFFSET_SENDERS[called]:
                found.append(where)
            elif called == "commit" and any(k.arg in ("offsets", "message") for k in call.keywords):
                found.append(where + "offsets=...)")
            elif called == "group_metadata" and name not in (RECOVERY, CLIENT_FACTORY):
                own = "layout_group" if name == GROUP_LAYOUT else "coordinator_group"
                if own not in ast.unparse(call):
                    found.append(
                        where + f"{ast.unparse(call.args)}) for a group other than the coordinator's"
                    )
            elif called == "sink_group_metadata" and name == COORDINATOR:
                found.append(where + "): the coordinator sends its own group's offsets only")
    assert not found, "only protocol/recovery.py writes the sink group's offsets:\n" + "\n".join(found)
    record = MODULES[GROUP_LAYOUT].read_text().split("def _write_record")[1].split("\ndef ")[0]
    assert "group_metadata(channel.layout_group)" in record, "the layout record commits to its own group only"
    senders = {called for called, _ in _calls(RECOVERY)}
    assert {"send_offsets", "group_metadata"} <= senders, "the check no longer sees recovery's own writes"


def test_test_modules_have_unique_names() -> None:
    """pytest imports test modules by their base name (the test folders are not packages): two
    ``test_x.py`` in different folders stop the collection of the whole suite."""
    from collections import Counter

    tests = Path(__file__).resolve().parent
    names = Counter(p.name for p in tests.rglob("test_*.py") if ".venv" not in p.parts)
    assert not [n for n, count in names.items() if count > 1], names.most_common(3)
