# Shared by ops/*: find Python ≥ 3.11, create .venv if missing, install the project
# with all its extras (embedded server, CLI, tests) when pyproject.toml changed. Sourced, not run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export LITELLM_LOCAL_MODEL_COST_MAP=True HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
STAMP=.venv/.contextledger-installed
# The fast path (every ops/test of one file pays it): installed, and pyproject.toml not
# touched since the install was last checked. Otherwise the checks below (~0.3 s).
if [ -x .venv/bin/python ] && [ -s "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ]; then
  return 0
fi
PY=""
for candidate in python3.13 python3.12 python3.11 python3; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    PY="$candidate"; break
  fi
done
[ -n "$PY" ] || { echo "contextledger needs Python >= 3.11" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
  echo "· creating .venv with $($PY --version)" >&2
  "$PY" -m venv .venv
fi
# what pip installs depends on [project] and [build-system] only: editing the tools'
# settings (pytest, ruff, mypy) must not cost a reinstall
WANT="$("$PY" -c 'import hashlib, json, tomllib
d = tomllib.load(open("pyproject.toml", "rb"))
print(hashlib.sha256(json.dumps([d.get("project"), d.get("build-system")], sort_keys=True).encode()).hexdigest()[:16])')"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "· installing contextledger and its test extras into .venv (first run takes ~1 min)" >&2
  .venv/bin/python -m pip install -q --upgrade pip >&2
  .venv/bin/python -m pip install -q -e ".[all,test]" >&2
  echo "$WANT" > "$STAMP"
fi
touch "$STAMP"  # checked against this pyproject.toml: the fast path above until it changes
