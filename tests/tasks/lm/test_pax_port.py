"""docs/pax.md, "Porting a Pax experiment": Pax's C4Spmd2BAdam4Replicas, written as in paxml 1.4
with only its imports changed (tests/tasks/lm/pax_ported_c4.py), builds the same run as ours."""

import pathlib
import re

from paxlite.experiments import registry
from paxlite.runtime import mesh_checks
from tasks.lm import c4
from tests import REPO


def test_the_ported_pax_file_builds_the_same_run():
    from tests.tasks.lm import pax_ported_c4

    ported = registry.get("tests.tasks.lm.pax_ported_c4.C4Spmd2BAdam4Replicas")
    assert ported is pax_ported_c4.C4Spmd2BAdam4Replicas
    ours = c4.C4Spmd2BAdam4Replicas
    assert ported().task() == ours().task()
    assert ported().datasets() == ours().datasets()
    assert mesh_checks.MeshPlan.of(ported()).sizes == mesh_checks.MeshPlan.of(ours()).sizes


def test_the_docs_show_the_ported_file():
    from tests.tasks.lm import pax_ported_c4

    page = (REPO / "docs" / "pax.md").read_text()
    section = page.split("## Porting a Pax experiment", 1)[1].split("\n## ", 1)[0]
    ported = pathlib.Path(pax_ported_c4.__file__).read_text()
    imports = [line for line in ported.splitlines() if line.startswith(("from ", "import "))]
    shown = [re.sub(r"\s+#.*", "", line) for line in section.splitlines()]
    assert imports and all(line in shown for line in imports), imports
    assert "class C4Spmd2BAdam4Replicas(c4.C4SpmdAdam):" in ported
    assert "class C4Spmd2BAdam4Replicas(c4.C4SpmdAdam):" in " ".join(shown)
