"""Train runs of the regeneration in a clean clone of 5a31b9d; see README.md beside this file.

    git clone <this repository> regen && cd regen && git checkout 5a31b9d
    PYTHONPATH=$PWD python <main checkout>/results/regen/train.py list      # the run names
    PYTHONPATH=$PWD python <main checkout>/results/regen/train.py EXPERIMENT/RUN [...]

Each run is the suite's config at that commit, except the mode ablation's q = 0 and q = 1 runs, which train
at the main comparison's budget with three seeds (`ablation-modes/empo2-q{0,1}-seed{0,1,2}`): the committed
10-iteration runs cannot separate any variant. A run resumes from its last checkpoint.
"""
import sys

import empo2
from empo2 import suite
from empo2.experiments import run

PROFILE, RESULTS = "laptop", "results"


def named_configs() -> dict:
    configs = [cfg for group in suite.GROUPS for cfg in suite.group_configs(group, PROFILE, RESULTS)]
    configs.append(suite.reference_run(PROFILE, RESULTS))
    for q, name in ((0.0, "q0"), (1.0, "q1")):
        configs += [suite._cfg(PROFILE, RESULTS, "ablation-modes", method="empo2", task=suite.MAIN_TASK, q=q, seed=seed,
                               run_name=f"empo2-{name}-seed{seed}", **suite.MAIN_BUDGET[PROFILE])
                    for seed in (0, 1, 2)]
    return {f"{cfg.experiment}/{cfg.name}": cfg for cfg in configs}


if __name__ == "__main__":
    print(f"empo2 from {empo2.__file__}", file=sys.stderr)
    known = named_configs()
    if sys.argv[1:] == ["list"]:
        print("\n".join(sorted(known)))
        sys.exit()
    for name in sys.argv[1:]:
        print(f"start {name}", flush=True)
        run(known[name], show_progress=False)
        print(f"finished {name}", flush=True)
