"""The package layering of docs/architecture.md: every import (lazy and TYPE_CHECKING ones too)
goes to the same unit or to a lower layer, so the graph has no cycles and each layer can be read
and tested without the ones above it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import minisgl

# Bottom to top, as in docs/architecture.md. A unit is a subpackage or a top-level module.
LAYERS: list[set[str]] = [
    {"priority"},
    {"constrained", "kernels", "tuning", "heap"},
    {"registry", "sampling", "layers", "distributed", "text"},
    {"batch", "kvcache"},
    {"attention", "models", "request", "sampler"},
    {"config"},
    {"engine"},
    {"parallel"},
    {"scheduler"},
    {"llm"},
    {"server", "minisgl"},
    {"cli"},
    {"__main__"},
]
LAYER_OF = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "minisgl"


def imports_of(path: Path, module: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{module}: relative import")  # the layering reads absolute names only
    return {m for m in found if m == "minisgl" or m.startswith("minisgl.")}


def test_every_import_goes_down_the_layers() -> None:
    root = Path(minisgl.__file__).parent
    violations, units = [], set()
    for path in sorted(root.rglob("*.py")):
        module = ".".join(("minisgl", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        unit = unit_of(module)
        units.add(unit)
        assert unit in LAYER_OF, f"{module} belongs to no layer: add {unit!r} to LAYERS and docs/architecture.md"
        for target in imports_of(path, module):
            other = unit_of(target)
            if other != unit and LAYER_OF[other] >= LAYER_OF[unit]:
                violations.append(f"{module} imports {target} (layer {LAYER_OF[other]} >= {LAYER_OF[unit]})")
    assert not violations, "\n".join(violations)
    assert units == set(LAYER_OF), f"layers name units that do not exist: {set(LAYER_OF) - units}"


def test_the_server_front_end_loads_no_torch() -> None:
    """The front end (the CLI, the config, the HTTP stack, the tokenizer) never imports torch: only the
    scheduler process runs the model, and torch would cost the front end its memory and start-up."""
    code = (
        "import sys, minisgl, minisgl.cli, minisgl.server.launch, minisgl.server.app\n"
        "from minisgl.models.source import load_tokenizer\n"
        "load_tokenizer(None).apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=True)\n"
        "print('torch' in sys.modules, sorted(m for m in sys.modules if m.startswith('minisgl')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("False"), f"torch was imported; the modules loaded: {out}"
