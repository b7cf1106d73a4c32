"""The `compare` suite's train-step rows alone (ours, torch eager, torch.compile), side by side,
without its 40 attention shapes against torch's flash kernel:

    python benchmarks/h200/compare_step.py FILE.json [--quick]
"""
import sys

from transformer_jax.benchmark import compare, report

quick = "--quick" in sys.argv
case = compare.train_cases(quick)[0]
ours = compare.jax_row(case, quick=quick)
rows = [ours]
for compiled in (False, True):
    peer = compare.torch_row(case, quick=quick, compile=compiled)
    ratio = "ratio_compiled" if compiled else "ratio"
    ours[ratio] = ours["tokens_per_sec"] / peer["tokens_per_sec"]
    rows.append(peer)
notes = ["ratio: ours over torch eager; ratio_compiled: ours over torch.compile"]
print(report.table(rows))
report.write_json(sys.argv[1], report.document("compare", rows, quick=quick, notes=notes))
