VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

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

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs
