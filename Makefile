# The two commands of the README. Each creates .venv (torch first) when missing.
.PHONY: run test setup lint

setup:
	@bash scripts/setup_venv.sh

run: setup
	.venv/bin/ardea train

test: setup
	.venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check .
