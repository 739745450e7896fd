"""`python -m pipelines ...` is the `vlbert` command: how executors start a step's process with the
interpreter that runs them (a process of a local run's step ends with its scheduler: processes.py)."""

from pipelines.executors.processes import end_with_scheduler

if __name__ == "__main__":
    end_with_scheduler()  # first: the scheduler may end while the command's imports run

    from pipelines.cli import main

    main()
