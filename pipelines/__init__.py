"""Pipelines: the `vlbert` command, the runner of pipeline files, its step kinds and reports."""

# In each step's folder: the runner's record of the step (its kind, parameters, inputs and whether it
# is done), which reports read too.
STEP_FILE = "step.json"
