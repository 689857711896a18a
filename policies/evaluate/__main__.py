"""`python -m policies.evaluate`: the command line of :mod:`policies.evaluate` (``conf/evaluate.yaml``)."""

from policies.evaluate import main
from spectune import cli

if __name__ == "__main__":
    cli.hydra_entry(main, "evaluate")
