VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install clean gpu

# Recreated whenever the dependency pins change.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	$(PY) -c "import torch, torchvision.ops; torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/vlbert demo

# Two workers (on 2 cores the suite takes about three quarters of its time in one); the Slurm tests share
# one worker and its cluster (tests/conftest.py). `pytest FILE` alone runs in one process.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup

# On a GPU host: the project installed against the host's own torch (no pinned .venv), then the
# cuda tests and every GPU figure (bench/gpu_report.py), in about 10 minutes on one GPU (the compiled
# training step, which compiles for minutes, in a slot of its own: bench/gpu_report.py --parts 6). It
# needs no package index: the host's setuptools builds the project (--no-build-isolation) and nothing is
# fetched (--no-deps); the report names the dependencies the host lacks (docs/benchmarks.md says how
# to carry their wheels).
GPU_PYTHON ?= python3
gpu:
	$(GPU_PYTHON) -m pip install --quiet --no-build-isolation --no-deps -e .
	$(GPU_PYTHON) bench/gpu_report.py

clean:
	rm -rf $(VENV) runs
