"""The house rules of the package: imports run one way; the SDK imports nothing of the node."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
# folder -> (package, layer): SDK and wire core < cluster < broker < analytics < benchmarks
# (the benchmarks measure the analytics too); the simulator drives the cores of all below
FOLDERS = {"clients": ("rpcbus", 0), "conf": ("rpcbus.conf", 0),
           "cluster": ("rpcbus.cluster", 1), "broker": ("rpcbus.broker", 2),
           "analytics": ("rpcbus.analytics", 3), "benchmarks": ("rpcbus.benchmarks", 4),
           "sim": ("rpcbus.sim", 4)}
# the rules of the protocol: pure state machines (events and a clock in, messages out)
CORES = ["broker/router.py", "broker/peers.py", "broker/choice.py", "broker/figures.py",
         "broker/session_rules.py", "broker/lifecycle.py",
         "broker/session_policy.py", "cluster/core.py",
         "cluster/peers.py", "cluster/outbox.py", "cluster/membership.py",
         "cluster/providers.py", "clients/provider.py", "clients/protocol.py",
         "clients/calling.py"]
IO = {"asyncio", "socket", "selectors", "threading", "websockets", "redis", "time"}
LAYER_OF = sorted(((pkg, layer) for pkg, layer in FOLDERS.values() if pkg != "rpcbus"),
                  key=lambda p: -len(p[0]))


def layer(module: str) -> int | None:
    if module != "rpcbus" and not module.startswith("rpcbus."):
        return None
    for pkg, n in LAYER_OF:
        if module == pkg or module.startswith(pkg + "."):
            return n
    return 0


def imports(path: Path, typing: bool = True):
    """Every module ``path`` imports (lazy ones too), with its line; with ``typing``
    False, not those under ``if TYPE_CHECKING:`` (they never run)."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = set() if typing else {
        id(n) for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
        for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: a relative import"
            yield node.module, node.lineno
            yield from ((f"{node.module}.{a.name}", node.lineno) for a in node.names)


# modules of ours a core may reach that import a clock the cores never read through
# them: a default the cores replace with their own clock, a function only shells call
CLOCK_ALLOWED = {"cluster/warnings.py": "SparseWarnings' default clock (the core gives its own)",
                 "cluster/messages.py": "new_incarnation, called by the link at start"}


def path_of(module: str) -> Path | None:
    """The file of one of our modules (None: not ours, a name in one, or a package)."""
    best = max((pkg for pkg in FOLDERS.values() if module.startswith(pkg[0] + ".")),
               key=lambda pkg: len(pkg[0]), default=None)
    if best is None:
        return None
    folder = next(f for f, pkg in FOLDERS.items() if pkg == best)
    path = ROOT / folder / (module[len(best[0]) + 1:].split(".")[0] + ".py")
    return path if path.exists() else None


def test_the_cores_do_no_io_and_read_no_clock():
    """The cores import nothing that does I/O, starts tasks or reads a clock, not even
    through the modules of ours they import, followed to the end (time comes in as
    ``now`` or a clock); ``CLOCK_ALLOWED`` says which of ours may, and why. A package's
    ``__init__`` is not followed: importing ``rpcbus.errors`` runs it, but a core uses
    none of its names."""
    found = []
    for core in CORES:
        todo, seen = [ROOT / core], set()
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            where = path.relative_to(ROOT).as_posix()
            for module, line in imports(path, typing=False):
                if module.split(".")[0] in IO and where not in CLOCK_ALLOWED:
                    found.append(f"{core} -> {where}:{line}: {module}")
                mine = path_of(module)
                if mine is not None and mine.stem != "__init__":
                    todo.append(mine)
    assert not found, found


def test_imports_run_one_way():
    upward = []
    for folder, (_, mine) in FOLDERS.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            for module, line in imports(path):
                theirs = layer(module)
                if theirs is not None and theirs > mine:
                    upward.append(f"{folder}/{path.name}:{line} imports {module}")
                if module.split(".")[0] in FOLDERS:
                    upward.append(f"{folder}/{path.name}:{line} imports {module} by its folder")
    assert not upward, "\n".join(upward)


def test_importing_the_sdk_imports_nothing_of_the_node(tmp_path):
    code = "import json, sys, rpcbus; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    loaded = set(json.loads(out))
    node_only = {"redis", "hiredis", "cryptography", "prometheus_client", "pyspark", "click",
                 "structlog",
                 "cachetools", "uvloop", "rpcbus.broker", "rpcbus.cluster", "rpcbus.analytics",
                 "rpcbus.benchmarks"}
    assert "rpcbus.client" in loaded          # it did import the SDK
    assert not loaded & node_only, loaded & node_only


def test_connects_options_are_the_clients_keywords():
    """``rpcbus.Options`` (what mypy checks a ``connect`` call against) lists exactly the
    keywords ``Client`` takes: a new option cannot be added to one and forgotten in the
    other."""
    import inspect

    import rpcbus

    keywords = {name for name, p in inspect.signature(rpcbus.Client).parameters.items()
                if p.kind is p.KEYWORD_ONLY}
    assert set(rpcbus.Options.__annotations__) == keywords


def test_every_module_is_in_the_architecture_map():
    """docs/architecture.md's map ("Where a newcomer finds each part") names every module:
    in a row whose first cell starts with its folder (``folder/a.py``, ``b.py``), or, for
    the benchmarks, by name in their row."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    named: dict[str, set[str]] = {}
    for row in rows:
        first = row.split("|")[1]
        folder = first.split("`")[1].split("/")[0]
        names = named.setdefault(folder, set())
        names.update(n.split("/")[-1] for n in
                     re.findall(r"[\w/]*?(\w+)\.py", first))
        if first.strip() == "`benchmarks/`":
            names.update(re.findall(r"\b(\w+)\b", row))
    missing = [f"{folder}/{path.name}" for folder in FOLDERS if folder != "conf"
               for path in sorted((ROOT / folder).glob("*.py"))
               if path.stem not in ("__init__", "__main__") or folder == "clients"
               if path.stem not in named.get(folder, set())
               and path.name not in named.get(folder, set())]
    assert not missing, f"not in docs/architecture.md's map: {missing}"
