# Course entry points. `make lab` and `make test` are all a learner needs:
# both build the virtual environment in $(VENV) on first use.
#
# Overridable:
#   PYTHON      interpreter used to create the venv (must be >= 3.10)
#   VENV        where the venv lives
#   TORCH_SPEC  pip arguments for torch, installed only if the venv has no torch,
#               e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124"
#   LAB_ARGS    extra arguments for `jupyter lab`
#   PYTEST_ARGS extra arguments for pytest
#   TEST_JOBS   pytest-xdist workers for `make test` (default 2; 0 runs the tests in one process)
#   PIP_FLAGS   extra pip flags (default -q: no progress bars, errors still shown)
#   UV          a uv program (https://docs.astral.sh/uv/) to install the course's packages with instead of
#               pip: the same versions, several times faster (.ci/run uses it). torch still goes through
#               pip with TORCH_SPEC, so pip's settings (an index for CPU or CUDA builds) keep choosing it.
#   COMPAT_TESTS, COMPAT_VENV  what `make test-compat` runs, and where its venv lives
#   RELEASE_DIR where `make release` writes the learner course (and RELEASE_DIR.tar.gz)
#   RELEASE_ARGS extra arguments for the release, e.g. --allow-colab-placeholder for a draft
#               built before REPOSITORY (autograder/notebooks/colab.py) is set
#   SITE=1      `make release` also builds the course website into RELEASE_DIR-site (and .tar.gz)
#   SITE_DIR, OFFLINE  where `make site` writes the website; OFFLINE=1 builds it from the cache only

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
LAB_ARGS    ?=
PYTEST_ARGS ?=
TEST_JOBS   ?= 2
PIP_FLAGS   ?= -q
UV          ?=

VENV_PY := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: venv lab test soak hub collect test-compat bench bench-hub bench-cluster bench-output bench-trace bench-grading bench-class bench-class-hub bench-ddp bench-ring bench-plan course grade instructor release site clean-venv

venv: $(STAMP)

# Create the bare venv (only if its interpreter is missing).
$(VENV_PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { \
	  echo "error: this course needs Python >= 3.10, but '$(PYTHON)' is" \
	       "$$($(PYTHON) --version 2>/dev/null || echo 'not installed')." >&2; \
	  echo "       Install Python 3.10 or newer (e.g. 'sudo apt install python3.11 python3.11-venv'," >&2; \
	  echo "       or from https://www.python.org/downloads/) and rerun, e.g. 'make PYTHON=python3.11 ...'." >&2; \
	  exit 1; }
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { \
	  echo "error: '$(PYTHON)' cannot create virtual environments (no venv/ensurepip module)." >&2; \
	  echo "       On Debian/Ubuntu install the matching package, e.g. 'sudo apt install python3-venv'." >&2; \
	  exit 1; }
	$(PYTHON) -m venv $(VENV)

# Install torch (unless one is already importable) and the helpers package with
# its course and test extras. Re-runs only when pyproject.toml changes.
$(STAMP): pyproject.toml | $(VENV_PY)
	@if $(VENV_PY) -c 'import torch' >/dev/null 2>&1; then \
	  echo "torch $$($(VENV_PY) -c 'import torch; print(torch.__version__)') already installed in $(VENV); keeping it"; \
	else \
	  echo "$(VENV_PY) -m pip install $(PIP_FLAGS) $(TORCH_SPEC)"; \
	  $(VENV_PY) -m pip install $(PIP_FLAGS) $(TORCH_SPEC); \
	fi
	$(if $(UV),$(UV) pip install --quiet --python $(VENV_PY) --compile-bytecode,$(VENV_PY) -m pip install $(PIP_FLAGS)) -e '.[dev]'
	$(VENV_PY) $(COMPILE_COURSE)
	@touch $@

# The course's own packages, compiled to bytecode where they are (only what changed; a fraction of a second). An
# editable install leaves them as source, and a process that may not write their __pycache__ (the grading sandbox,
# a learner's server on the hub, a container with PYTHONDONTWRITEBYTECODE=1) compiles them again on every start:
# 0.3 to 0.6 s of each kernel, rank factory and clean re-grade.
COMPILE_COURSE = -m compileall -q -j 0 helpers autograder devtools

# JupyterLab refuses to start as root (containers, cloud GPU boxes, many lab servers)
# unless it is told it may; pass the flag only then, and say so. The venv's bin folder
# goes first on PATH: nbgrader (formgrader, Validate) runs `alembic` by name.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)
SAY_ROOT   := $(if $(ALLOW_ROOT),@echo "Running as root: starting JupyterLab with --allow-root.",@true)

lab: venv
	$(SAY_ROOT)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/jupyter lab course/ $(ALLOW_ROOT) $(LAB_ARGS)

# The suite runs on TEST_JOBS pytest-xdist workers (TEST_JOBS=0: in this process, one test after
# another). Each module stays whole on one worker, longest first (tests/conftest.py); most
# tests wait on ranks, kernels and browsers more than they compute, so 2 workers fit 2 cores.
test: venv
	@$(VENV_PY) $(COMPILE_COURSE)
	$(VENV_PY) -m pytest $(if $(filter-out 0,$(TEST_JOBS)),-n $(TEST_JOBS)) $(PYTEST_ARGS)

# Not part of `make test`: the modules most exposed to timing (kernels, %%distributed, the ranks'
# output, the browser, a graded class) run SOAK_RUNS times each while SOAK_LOAD busy processes
# keep the cores occupied; every failure is a bug to fix at its cause. Logs: SOAK_OUT/.
# devtools/soak.py says more; SOAK_GROUPS picks some of kernel,magics,output,browser,grading,hub.
SOAK_RUNS   ?= 10
SOAK_LOAD   ?= $(shell nproc 2>/dev/null || echo 2)
SOAK_GROUPS ?= kernel,magics,output,browser,grading
SOAK_OUT    ?= soak-results

soak: venv
	$(VENV_PY) -m devtools.soak --runs $(SOAK_RUNS) --load $(SOAK_LOAD) --groups $(SOAK_GROUPS) --out $(SOAK_OUT) $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS))

# The launch tests and every solution notebook against another torch (and Python), in a
# venv of its own under .venv-compat/, for the two ends of the supported range, e.g.
#   make test-compat PYTHON=python3.10 TORCH_SPEC=torch==2.4.1
# The default `make test` venv is left alone. COMPAT_TESTS picks other tests. The notebooks run with their hidden
# tests here (COURSE_NOTEBOOK_HIDDEN_TESTS=run): every graded part on the instructor's answers, on that torch.
COMPAT_TESTS ?= tests/test_launch.py tests/test_notebooks.py::test_solution_notebook_runs_top_to_bottom
COMPAT_VENV  ?= .venv-compat/$(shell printf '%s-%s' '$(notdir $(PYTHON))' '$(firstword $(filter torch%,$(TORCH_SPEC)))' | tr -c 'A-Za-z0-9.=_-' '_')

test-compat:
	@$(MAKE) --no-print-directory venv VENV=$(COMPAT_VENV)
	@$(COMPAT_VENV)/bin/python -c 'import sys, torch, numpy; print(f"test-compat in $(COMPAT_VENV): python {sys.version.split()[0]}, torch {torch.__version__}, numpy {numpy.__version__}")'
	COURSE_NOTEBOOK_HIDDEN_TESTS=run $(COMPAT_VENV)/bin/python -m pytest $(COMPAT_TESTS) $(PYTEST_ARGS)

# Benchmarks, each a script in bench/ (bench/README.md: what they measure, targets, figures):
#   bench          launching ranks: cold and warm launch against mp.spawn and torchrun (launch_bench.py)
#   bench-cluster  round trip of one request to running ranks: an empty %%distributed cell, Cluster.run
#   bench-output   3000 %%distributed cells printing on every rank, cores busy: lines missing from their cell
#   bench-trace    what tracing and hang diagnosis cost on the reference ring all-reduce at 1 MB
#   bench-ddp      lesson 06: time per training step, averaging after backward against MiniDDP and DDP
#   bench-ring     lesson 08: bus bandwidth of gloo's all_reduce, the reference ring and the pipelined ring, 4-64 MB
#   bench-class    a class of 30 lesson-04 submissions graded with JOBS=1 and JOBS=2: time, speed-up, same scores
#   bench-grading  seconds to autograde one learner's submission of each lesson
#   bench-hub      one learner's server on the hub running lesson 04: memory and CPU (hub_bench.py)
#   bench-class-hub a class of LEARNERS on `make hub` (root): fetch, run and submit lesson 04 within SPREAD
#                  seconds, then collect and grade (JOBS); peak memory and CPU, each step's slowest learner,
#                  nothing lost (hub_class_bench.py; figures also in BENCH_JSON)
#   bench-plan     lesson 12: the planner against measurement, the collective model on held-out sizes (plan_bench.py)
# bench-NAME runs bench/NAME_bench.py.
BENCHES := bench-cluster bench-output bench-trace bench-ddp bench-ring bench-class bench-grading bench-hub bench-plan

bench: venv
	$(VENV_PY) bench/launch_bench.py

$(BENCHES): bench-%: venv
	$(VENV_PY) bench/$*_bench.py

LEARNERS   ?= 30
BROWSERS   ?= 3
SPREAD     ?= 60
BENCH_JSON ?= bench-class-hub.json
bench-class-hub: venv
	$(VENV_PY) bench/hub_class_bench.py --learners $(LEARNERS) --browsers $(BROWSERS) --spread $(SPREAD) --jobs $(or $(JOBS),2) --json $(BENCH_JSON)

# Instructor: regenerate the learner notebooks in course/ from solutions/.
course: venv
	$(VENV_PY) -m autograder build

# Instructor: autograde a folder of <student>/<lesson>/<lesson>.ipynb, with feedback, CSV and
# the class summary, on Dask workers: JOBS worker processes on this machine (default: one per
# core), or SCHEDULER=tcp://host:8786 (a running Dask cluster's workers), or SLURM=1 (or
# SLURM=jobs=4,cores=8,partition=NAME,...: workers as SLURM jobs; DRY_RUN=1 prints the job
# script). Each submission runs in a bubblewrap sandbox; NO_SANDBOX=1 grades without it
# (learners' code then runs with your rights). ONLY_UNGRADED=1 grades only what has no grade
# yet (never graded, failed last time, or left by Ctrl-C).
JOBS          ?=
SCHEDULER     ?=
SLURM         ?=
DRY_RUN       ?=
NO_SANDBOX    ?=
ONLY_UNGRADED ?=
grade: venv
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=path/to/folder [JOBS=N | SCHEDULER=tcp://host:8786 | SLURM=1|key=value,... [DRY_RUN=1]] [NO_SANDBOX=1] [ONLY_UNGRADED=1]" >&2; exit 2; }
	$(VENV_PY) -m autograder grade $(SUBMISSIONS) $(if $(JOBS),--jobs $(JOBS)) $(if $(SCHEDULER),--scheduler $(SCHEDULER)) $(if $(SLURM),--slurm $(filter-out 1 yes true,$(SLURM))) $(if $(filter 1 yes true,$(DRY_RUN)),--dry-run) $(if $(filter 1 yes true,$(NO_SANDBOX)),--no-sandbox) $(if $(filter 1 yes true,$(ONLY_UNGRADED)),--only-ungraded)

# Instructor: nbgrader's collect of one lesson from the exchange (the course's JupyterHub), then
# `make grade` of what it collected, with the same options (docs/instructors.md, "Running the
# course on a JupyterHub"). Then `nbgrader release_feedback LESSON` hands the feedback back.
collect: venv
	@test -n "$(LESSON)" || { echo "usage: make collect LESSON=04-ring-all-reduce [JOBS=N | SCHEDULER=... | SLURM=...] [NO_SANDBOX=1]" >&2; exit 2; }
	$(VENV_PY) -m autograder collect $(LESSON) $(if $(JOBS),--jobs $(JOBS)) $(if $(SCHEDULER),--scheduler $(SCHEDULER)) $(if $(SLURM),--slurm $(filter-out 1 yes true,$(SLURM))) $(if $(filter 1 yes true,$(NO_SANDBOX)),--no-sandbox)

# Instructor: the course on a JupyterHub on this machine, as root (hub/serve.py says what it checks
# and prepares; docs/instructors.md how to add learners). configurable-http-proxy, the hub's
# proxy, is installed with npm into hub/.proxy/ on first use.
HUB_PORT       ?= 8000
HUB_INSTRUCTOR ?=
HUB_GROUP      ?= course-learners
HUB_COURSE     ?= $(CURDIR)
HUB_EXCHANGE   ?= /srv/nbgrader/exchange
HUB_STATE      ?= hub/run
# Seconds a server may stay idle before jupyterhub-idle-culler stops it (0: never).
HUB_IDLE_TIMEOUT ?= 3600
HUB_PROXY      := hub/.proxy/node_modules/.bin/configurable-http-proxy
# Every learner's server runs the course's venv as that learner: the venv, and the Python it was
# made from, must be readable by all users. $(VENV) is used when it is; otherwise (a Python under
# /root, as pyenv installs it) a venv of its own is built from HUB_PYTHON, once: from $(VENV)'s
# packages when both Pythons have the same minor version (hub/venv.py, seconds), else with pip
# (about a minute).
HUB_PYTHON     ?= /usr/bin/python3
# nbgrader's exchange: folder (a shared folder, Unix rights) or ngshare (a hub service; every server may
# be the same Unix user, as on Kubernetes). ngshare-exchange pins jupyter-core<4.11.2, which JupyterLab 4
# cannot meet, hence --no-deps (hub/ngshare_service.py and docs/instructors.md say what was checked).
EXCHANGE       ?= folder
NGSHARE_PACKAGES = ngshare==0.6.0 ngshare-exchange==0.5.3
HUB_VENV       ?= $(if $(shell runuser -u nobody -- $(VENV_PY) -c pass >/dev/null 2>&1 && echo yes),$(VENV),.venv-hub)

$(HUB_PROXY):
	@command -v npm >/dev/null 2>&1 || { \
	  echo "error: npm is not installed, and the hub's proxy (configurable-http-proxy) comes from npm." >&2; \
	  echo "       Install Node.js 18 or newer with npm (e.g. 'apt-get install nodejs npm') and rerun 'make hub'." >&2; \
	  exit 1; }
	npm install --prefix hub/.proxy --no-audit --no-fund --silent configurable-http-proxy@5

hub: $(HUB_PROXY)
	@if [ "$(HUB_VENV)" != "$(VENV)" ] && [ ! -e "$(HUB_VENV)" ] && [ -e "$(STAMP)" ]; then \
	  $(HUB_PYTHON) hub/venv.py $(VENV) $(HUB_VENV) || [ $$? = 3 ]; fi
	@$(MAKE) --no-print-directory venv VENV=$(HUB_VENV) $(if $(filter-out $(VENV),$(HUB_VENV)),PYTHON=$(HUB_PYTHON))
	@if [ "$(EXCHANGE)" = ngshare ] && ! $(HUB_VENV)/bin/python -c "import ngshare, ngshare_exchange" 2>/dev/null; then \
	  $(HUB_VENV)/bin/python -m pip install --no-deps $(NGSHARE_PACKAGES); fi
	@$(HUB_VENV)/bin/python $(COMPILE_COURSE)  # learners' servers may not write the course's bytecode
	$(HUB_VENV)/bin/python hub/serve.py --port $(HUB_PORT) --instructor "$(HUB_INSTRUCTOR)" --group $(HUB_GROUP) --course $(HUB_COURSE) --exchange $(HUB_EXCHANGE) --state $(HUB_STATE) --proxy $(HUB_PROXY) --idle-timeout $(HUB_IDLE_TIMEOUT) --exchange-kind $(EXCHANGE)

# Instructor: JupyterLab at the repository root, with nbgrader's formgrader.
instructor: venv
	$(SAY_ROOT)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/jupyter lab $(ALLOW_ROOT) $(LAB_ARGS)

# Instructor: the learner distribution (course/, helpers, self-checks; no solutions or hidden
# tests) as a folder to publish as its own repository, and RELEASE_DIR.tar.gz next to it.
RELEASE_DIR ?= dist/learner-course
RELEASE_ARGS ?=
SITE        ?=

release: venv
	$(VENV_PY) -m autograder release $(RELEASE_ARGS) $(RELEASE_DIR)
	$(if $(filter 1 yes true,$(SITE)),$(VENV_PY) -m autograder site --archive $(RELEASE_DIR)-site)

clean-venv:
	rm -rf $(VENV)

# Instructor: the learner course as a static website in SITE_DIR (default dist/site): each lesson's learner notebook
# with the outputs of a real run of its instructor notebook (cached by content in .cache/site, so only changed lessons
# run again), none that give an answer away. OFFLINE=1 runs no notebook and names those missing from the cache.
# docs/instructors.md#the-course-website says how to publish it.
SITE_DIR ?= dist/site
OFFLINE  ?=
site: venv
	$(VENV_PY) -m autograder site $(if $(filter 1 yes true,$(OFFLINE)),--offline) $(SITE_DIR)
