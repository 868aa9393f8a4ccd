"""An import-linter contract type the built-in ones lack: an allow-list of third-party imports.

`forbidden` contracts name what a layer must not import; the library's promise is the converse
(it imports the standard library, its chosen dependencies and nothing else), so a new dependency
must be added here, on purpose, to pass `make lint`. Registered in pyproject.toml
(`contract_types`); lint-imports puts the working directory on sys.path, so this module needs no
installing.

    [[tool.importlinter.contracts]]
    type = "allowed_external"
    source_modules = ["presto_ray"]
    allowed = ["numpy", "pydantic"]                      # anywhere in the source modules
    allowed_in = ["presto_ray.engines.vllm -> vllm"]     # only in that module or package
"""

from __future__ import annotations

import sys

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


class AllowedExternalContract(Contract):
    type_name = "allowed_external"

    source_modules = fields.ListField(subfield=fields.StringField())
    allowed = fields.ListField(subfield=fields.StringField(), required=False, default=[])
    allowed_in = fields.ListField(subfield=fields.StringField(), required=False, default=[])

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        sources = [str(m) for m in self.source_modules]  # type: ignore[attr-defined]
        allowed = {str(p) for p in self.allowed}  # type: ignore[attr-defined]
        allowed_in = [_allowance(str(line)) for line in self.allowed_in]  # type: ignore[attr-defined]
        roots = {module.split(".")[0] for module in graph.modules if not graph.is_module_squashed(module)}
        violations = []
        for module in sorted(graph.modules):
            if not any(_within(module, source) for source in sources):
                continue
            for imported in sorted(graph.find_modules_directly_imported_by(module)):
                top = imported.split(".")[0]
                if top in roots or top in sys.stdlib_module_names or top in allowed:
                    continue
                if any(_within(module, where) and top == package for where, package in allowed_in):
                    continue
                lines = sorted(d["line_number"] for d in graph.get_import_details(importer=module, imported=imported))
                violations.append(f"{module} -> {imported} (l. {', '.join(map(str, lines))})")
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        output.print("Imports of third-party packages the contract does not allow here:")
        for line in check.metadata["violations"]:
            output.print_error(f"- {line}", bold=False)
        output.new_line()


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _allowance(line: str) -> tuple[str, str]:
    where, _, package = (part.strip() for part in line.partition("->"))
    if not where or not package:
        raise ValueError(f"allowed_in entries read 'module -> package', not {line!r}")
    return where, package
