"""Run a selection without pytest: preflight, then every runnable group on every scenario.

    python benchmarks/run_selection.py --device cpu --groups g0_target_only,g1_ngram --label X

Writes the same files as the plugin (manifest, handoff, summaries, raw, logs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_specsel.backends.vllm.backend import make_vllm_backend
from pytest_specsel.core.records import Device
from pytest_specsel.core.records import RunStatus
from pytest_specsel.core.study import GROUPS
from pytest_specsel.files.artifacts import claim_label
from pytest_specsel.files.artifacts import default_label
from pytest_specsel.run.runner import Selection
from pytest_specsel.study.file import load_study


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--label", default=None)
    parser.add_argument("--groups", default=",".join(GROUPS[:2]), help="comma-separated groups to launch")
    parser.add_argument("--scenarios", default="", help="comma-separated scenario keys (default: all)")
    args = parser.parse_args()
    root = Path.cwd()
    study = load_study(args.config, root)
    label = args.label or study.run_label or default_label()
    paths = claim_label(study.results_dir, label, "--label")
    bundle = make_vllm_backend(args.device, root)
    device = Device(args.device)
    run = Selection(study, bundle, paths, real=True, device=device, say=lambda m: print(m, flush=True))
    try:
        run.preflight()
        for name in run.names():
            admission = run.state(name).admission
            print(f"{name}: {admission.status.value}: {admission.reason.value} ({admission.detail})")
        keys = [k for k in args.scenarios.split(",") if k]
        scenarios = [s for s in run.scenarios if not keys or s.key in keys]
        for name in args.groups.split(","):
            if run.state(name).run_status is not RunStatus.RUNNABLE:
                continue
            run.plan(name, scenarios)
            try:
                run.open(name)
                for scenario in scenarios:
                    run.measure(name, scenario)
            finally:
                run.close(name)
    except KeyboardInterrupt:
        run.mark_interrupted()
        raise
    finally:
        files = run.finish()
        print(f"manifest: {files['manifest']}\nhandoff: {files['handoff']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
