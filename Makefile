# gpu-pivot: `make` lists the targets. Every target installs what it needs first.
VENV    ?= .venv
PY      := $(VENV)/bin/python
INVOKE  := $(VENV)/bin/invoke
HOST    ?= sandbox
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'
	@echo
	@echo "The tasks themselves (README.md, runbooks/): in a shell with the venv activated,"
	@echo "  . $(VENV)/bin/activate        # once per shell, after make setup or make demo"
	@echo "  invoke --list               # every task; invoke TASK --help for one"
	@echo "  invoke status               # no --host: the built-in sandbox host"

.PHONY: setup
setup: $(VENV)/.installed $(VENV)/.output-guard ## create .venv with the pinned runtime + development requirements
.PHONY: runtime
runtime: $(VENV)/.runtime $(VENV)/.output-guard ## create .venv with the pinned runtime requirements only (what the tasks run on)
$(VENV)/.runtime: requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt
	touch $@
# the tests, linter and type checker on top (requirements-dev.txt includes requirements.txt)
$(VENV)/.installed: $(VENV)/.runtime requirements-dev.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@
.PHONY: requirements
requirements: ## remake requirements.txt and requirements-dev.txt from pyproject.toml (the one place pins are written)
	python3 -m scripts.pins runtime > requirements.txt
	python3 -m scripts.pins dev > requirements-dev.txt

# Invoke's own --version (read before tasks.py) gets the closed-pipe / full-disk guard from a .pth
$(VENV)/.output-guard: $(VENV)/.runtime scripts/cli/output_guard.py
	$(PY) -m scripts.cli.output_guard >/dev/null
	touch $@

.PHONY: system-deps
system-deps: ## apt-get the system packages the tests use when missing: .ci/packages, the list CI installs
	@bash .ci/install-packages

# pytest-xdist workers: most tests wait on processes, not the CPU, so more workers than cores
# (a fresh clone on 2 cores: 318 s with 5, 265-278 s with 6, 254 s with 8).
# Each worker but one runs in namespaces of its own (tests/support/workers.py, tests/support/pidns.py).
TEST_WORKERS ?= 8
# With PYTHONDONTWRITEBYTECODE set (some images set it), every worker rewrote every test module's
# asserts and every CLI call the tests make compiled the project again: measured 4.6 s -> 1.9 s
# of collection per worker. The tests' own bytecode is theirs to keep; nothing else changes.
NO_BYTECODE_OFF = env -u PYTHONDONTWRITEBYTECODE
PYTEST_ARGS  ?=
.PHONY: test
test: setup system-deps ## run the test suite, the same tests as CI, in parallel (only GPU tests skip without a GPU)
	$(NO_BYTECODE_OFF) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -rfEs $(PYTEST_ARGS)

.PHONY: test-durations
test-durations: setup system-deps ## make test with --durations=0, then tests/support/durations.json from it (the suite starts its longest tests first)
	@log=$$(mktemp) && trap 'rm -f "$$log"' EXIT && \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=0 $(PYTEST_ARGS) | tee "$$log" && \
	$(PY) -m tests.support.durations "$$log"

.PHONY: test-stress
test-stress: setup system-deps ## make test 5 times on a busy machine (bench/stress_tests.sh: CPU hogs, hostile processes); numbers to bench/results/
	bash bench/stress_tests.sh $(or $(RUNS),5)

.PHONY: test-gpu
test-gpu: setup ## run only the GPU tests (on a machine with NVIDIA GPUs)
	$(PY) -m pytest -q -m gpu -rs

.PHONY: lint
lint: setup ## ruff on the Python, shellcheck on the shell scripts (installed from .ci/packages when missing; settings: pyproject.toml)
	@command -v shellcheck >/dev/null 2>&1 || bash .ci/install-packages --only shellcheck
	$(VENV)/bin/ruff check .
	shellcheck -s sh scripts/emergency/*.sh
	shellcheck bench/*.sh .ci/run .ci/install-packages tests/support/standin/pct tests/support/standin/bad-json-agent scripts/slurm/epilog scripts/slurm/prolog scripts/slurm/job.sh scripts/completion.bash

.PHONY: typecheck
typecheck: setup ## mypy on tasks.py and scripts/, the agent included (settings: pyproject.toml)
	$(VENV)/bin/mypy

.PHONY: demo
demo: runtime ## the main job on the SANDBOX host (only its own private dir): see holders, tear down, verify, bystanders alive; leaves the sandbox up and says how to stop it
	$(INVOKE) sandbox up
	$(INVOKE) ping --host sandbox
	$(INVOKE) status --host sandbox
	$(INVOKE) teardown --host sandbox --yes --grace 5
	$(INVOKE) verify --host sandbox
	$(INVOKE) sandbox status
	$(PY) -m scripts.ops.sandbox check

.PHONY: teardown
teardown: runtime ## free the GPUs of HOST (make teardown HOST=gpu1); asks first on a terminal
	$(INVOKE) teardown --host $(HOST)

# On the SANDBOX the pivots need its processes and files, and run without asking.
PIVOT_PRE = $(if $(filter sandbox,$(HOST)),$(INVOKE) sandbox up >/dev/null &&,)
PIVOT_YES = $(if $(filter sandbox,$(HOST)),--yes,$(YES))

.PHONY: pivot-datagen
pivot-datagen: runtime ## EAGLE3 data-generation pivot: drain the EAGLE3 server, tear down, start the baseline server + dataset preps
	$(PIVOT_PRE) $(INVOKE) pivot --host $(HOST) --to datagen $(PIVOT_YES)

.PHONY: pivot-train
pivot-train: runtime ## extraction-to-training pivot: extraction done -> gates on the extracted files -> start training
	$(PIVOT_PRE) $(INVOKE) pivot --host $(HOST) --to train $(PIVOT_YES)

.PHONY: pivot-deploy
pivot-deploy: runtime ## patched-server deploy: old server -> patched server; smoke test; roll back if unhealthy
	$(PIVOT_PRE) $(INVOKE) pivot --host $(HOST) --to deploy $(PIVOT_YES)

.PHONY: bench
bench: setup system-deps ## run every benchmark side by side; results to bench/results/local-<date>.md (git-ignored), RESULTS.md untouched
	$(PY) bench/run.py

.PHONY: bench-publish
bench-publish: setup system-deps ## make bench, then also write the tracked bench/RESULTS.md (not when a section failed; GPU rows: bench/gpu_session.sh)
	$(PY) bench/run.py --publish

.PHONY: bench-everyday
bench-everyday: setup ## status, verify --wait and what each call ships: bytes per subcommand, status's round trip over `invoke --list` beside the commit before, step by step, verify's reaction to a holder's exit
	$(PY) bench/everyday.py

.PHONY: bench-startup
bench-startup: setup ## start-up only: `import tasks`, `invoke --list`, a local `invoke status`, beside the numbers from before
	$(PY) bench/startup.py

.PHONY: runbooks
runbooks: setup ## regenerate runbooks/emergency-one-liners.md from the code
	$(PY) -m scripts.emergency.runbook > runbooks/emergency-one-liners.md

.PHONY: status
status: runtime ## show who holds the GPUs of HOST
	$(INVOKE) status --host $(HOST)
