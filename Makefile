# Distributed Training from Scratch: make lab | make test | make demo | make release | make autograde
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
COURSE ?= course
JOBS ?= 1
PER_TASK ?= 1
FASHION := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)
LAB_FLAGS := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)   # containers and Colab run as root
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup data sandbox lab lab-instructor demo test release autograde autograde-slurm feedback clean help
help:
	@echo "make lab        install (once), copy the notebooks into student/ (once) and open JupyterLab there"
	@echo "make lab-instructor  JupyterLab on notebooks/ with nbgrader's instructor extensions"
	@echo "make test       run the whole test suite (quick mode)"
	@echo "make demo       notebook 01's scaling experiment, headless (1, 2, 4 MPI processes)"
	@echo "make release    regenerate notebooks/ from solutions/ (nbgrader)"
	@echo "make autograde  grade $(COURSE)/submitted/*/*/*.ipynb (JOBS=N at once, LIMITS=\"memory=4G,...\") and export $(COURSE)/grades.csv"
	@echo "make autograde-slurm  submit the grading of $(COURSE) as a SLURM array job (PER_TASK=K)"
	@echo "make feedback   HTML feedback for the autograded submissions"

setup: $(STAMP) data sandbox

$(STAMP): pyproject.toml constraints.txt
	@if [ -x $(PY) ]; then echo "setup: using the existing virtual environment $(VENV)"; \
	 else echo "setup: creating the virtual environment $(VENV)"; python3 -m venv $(VENV); fi
	@echo "setup: installing exercise_utils and its dependencies, pinned by constraints.txt (log: $(VENV)/install.log) ..."
	@$(PY) -m pip install --disable-pip-version-check -c constraints.txt -e ".[instructor,dev]" > $(VENV)/install.log 2>&1 \
	 || { grep -v '^WARNING: Location' $(VENV)/install.log | tail -30; echo "setup: pip install failed"; exit 1; }
	@$(PY) -c "import torch, torchvision, mpi4py, nbgrader; print('setup: torch', torch.__version__, '| torchvision', torchvision.__version__, '| mpi4py', mpi4py.__version__, '| nbgrader', nbgrader.__version__)"
	@touch $(STAMP)

data:
	@if [ -n "$${DTFS_DATA:-}" ]; then echo "setup: datasets from DTFS_DATA=$$DTFS_DATA"; \
	 elif [ -e $(FASHION) ]; then echo "setup: Fashion-MNIST present (Debian package dataset-fashion-mnist)"; \
	 elif command -v apt-get > /dev/null; then echo "setup: installing the Debian package dataset-fashion-mnist"; \
	   ( $(SUDO) apt-get install -y -q dataset-fashion-mnist > /dev/null 2>&1 \
	     || { $(SUDO) apt-get update -q > /dev/null 2>&1 && $(SUDO) apt-get install -y -q dataset-fashion-mnist > /dev/null 2>&1; } ) \
	   && echo "setup: installed dataset-fashion-mnist" \
	   || echo "setup: could not install dataset-fashion-mnist (no root?). Run: sudo apt-get install dataset-fashion-mnist, or see docs/students.md > Data"; \
	 else echo "setup: no apt-get here: see docs/students.md > Data to provide MNIST or Fashion-MNIST"; fi

# bubblewrap: make autograde runs student code in its sandbox (exercise_utils/sandbox.py) and
# refuses to grade without it unless UNSAFE=1; students' own checks do not need it.
sandbox:
	@if command -v bwrap > /dev/null; then :; \
	 elif [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null; then echo "setup: installing the Debian package bubblewrap (the grading sandbox)"; \
	   ( apt-get install -y -q bubblewrap > /dev/null 2>&1 \
	     || { apt-get update -q > /dev/null 2>&1 && apt-get install -y -q bubblewrap > /dev/null 2>&1; } ) \
	   && echo "setup: installed bubblewrap" \
	   || echo "setup: could not install bubblewrap; make autograde will need UNSAFE=1 (docs/grading-security.md: The sandbox)"; \
	 else echo "setup: no bubblewrap (only instructors grading need it: sudo apt-get install bubblewrap)"; fi

lab: setup
	$(PY) scripts/student.py
	JUPYTER_CONFIG_DIR=$(CURDIR)/student/.jupyter $(VENV)/bin/jupyter lab $(LAB_FLAGS) student/

lab-instructor: setup
	$(VENV)/bin/jupyter lab $(LAB_FLAGS) notebooks/

demo: setup
	$(PY) -m exercise_utils.mpi_parallel_sgd.demo

# Two passes: every test but the serial ones three at a time on 2 cores (pytest-xdist; a
# check's ranks often wait: for a peer, a timeout, a hang to show; checks call a hang a hang
# only when the ranks stop making progress, so a busy machine only slows them; the notebook
# and network tests assert no tight timings), an idle worker taking tests from a busy one's
# queue (worksteal: no worker runs the last long tests alone); then the tests that load the
# machine themselves or need it quiet (launch wall limits, the loaded-machine test, SLURM, the
# link-rate measurement), one at a time.
test: setup
	rm -rf work/profile
	DTFS_QUICK=1 $(PY) -m pytest tests -n 3 --dist worksteal -m "not serial"
	DTFS_QUICK=1 $(PY) -m pytest tests -m "serial"
	$(PY) tests/suite_profile.py work/profile

release: $(STAMP)
	$(PY) scripts/course.py release

autograde: $(STAMP)
	$(PY) scripts/course.py autograde --course $(COURSE) --jobs $(JOBS) $(if $(UNSAFE),--unsafe) $(if $(LIMITS),--limits "$(LIMITS)")

autograde-slurm: $(STAMP)
	$(PY) scripts/course.py autograde --course $(COURSE) --slurm --per-task $(PER_TASK) $(if $(UNSAFE),--unsafe) $(if $(LIMITS),--limits "$(LIMITS)")

feedback: $(STAMP)
	$(PY) scripts/course.py feedback --course $(COURSE)

clean:
	rm -rf work results notebooks/work notebooks/results .pytest_cache
