"""`python -m pipelines ...` is the `vlbert` command: how executors start a step's process with the
interpreter that runs them."""

from pipelines.cli import main

if __name__ == "__main__":
    main()
