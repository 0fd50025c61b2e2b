# The two commands of the README. Each creates .venv (torch first) when missing; the tests
# also .venv-vllm (vLLM's CPU build, a separate environment: it pins its own transformers).
.PHONY: run test setup setup-vllm lint

setup:
	@bash scripts/setup_venv.sh

# vLLM's CPU build in its own environment (.venv-vllm), for rollout.engine=vllm and its tests
setup-vllm:
	@bash scripts/setup_vllm_venv.sh

run: setup
	.venv/bin/ardea train

test: setup setup-vllm
	.venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check .
