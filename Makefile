# The two commands of the README. Each creates .venv (torch first) when missing; the tests
# also .venv-vllm (vLLM's CPU build, a separate environment: it pins its own transformers)
# and Debian's Chromium (one test renders a report page in it).
.PHONY: run test test-fast docs docs-gen setup setup-vllm setup-browser lint

setup:
	@bash scripts/setup_venv.sh

# vLLM's CPU build in its own environment (.venv-vllm), for rollout.engine=vllm and its tests
setup-vllm:
	@bash scripts/setup_vllm_venv.sh

# Debian's Chromium, for the test that renders the report's trajectories.html headless
setup-browser:
	@bash scripts/setup_browser.sh

run: setup
	.venv/bin/ardea train

# two workers (pytest-xdist), one per core: each module (the vLLM tests together) runs on one
# worker, so a module's fixtures are built once; the longest test starts first
# (tests/conftest.py). TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 2

test: setup setup-vllm setup-browser
	.venv/bin/python -m pytest -q -n $(TEST_WORKERS) --no-loadscope-reorder

# The edit-test loop: all but the slow end-to-end CLI runs, vLLM, torchrun and the browser,
# so it needs neither .venv-vllm nor Chromium (4 min 34 s on a 2-core Zen 3 EPYC, about
# 2,000 tests; `make test` runs everything)
test-fast: setup
	.venv/bin/python -m pytest -q -n $(TEST_WORKERS) --no-loadscope-reorder -m "not slow" \
		--ignore=tests/vllm_engine --ignore=tests/distributed -k "not chromium and not qwen3"

# The documentation site (mkdocs.yml), built offline and strictly into site/: a broken link, a
# missing reference or any warning fails it (the suite builds it too)
docs: setup
	.venv/bin/mkdocs build --strict

# The pages generated from the code, committed (docs/reference/config.md and cli.md, the
# lists of registered names): run after changing a config field, a command-line option or a
# registry (tests/test_docs.py fails while they are not current)
docs-gen: setup
	.venv/bin/python scripts/gen_docs.py

lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check .
