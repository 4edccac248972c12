# Sourced by scripts/test and scripts/demo: make sure the project's virtualenv
# exists and holds an editable install of THIS checkout, then put it first on PATH.
#   SAPWOOD_VENV  where the venv lives (default ~/.cache/sapwood/venv)
#   SAPWOOD_PIP_EXTRAS  extras to install (default all)

sapwood_venv() {
  local root venv py extras stamp want
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=${SAPWOOD_VENV:-$HOME/.cache/sapwood/venv}
  extras=${SAPWOOD_PIP_EXTRAS:-all}

  if [ ! -x "$venv/bin/python" ]; then
    py=""
    for cand in python3.11 python3.12 python3.13 python3; do
      if command -v "$cand" >/dev/null 2>&1 &&
        "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        py=$cand
        break
      fi
    done
    if [ -z "$py" ]; then
      echo "error: Python >= 3.11 not found (install python3.11)" >&2
      return 1
    fi
    echo "[venv] creating $venv with $py" >&2
    mkdir -p "$(dirname "$venv")"
    "$py" -m venv "$venv" || return 1
    "$venv/bin/python" -m pip install -q --upgrade pip || return 1
  fi

  # Reinstall when pyproject.toml changed or the editable install points at another checkout.
  stamp="$venv/.sapwood-install"
  # stamp lines: checkout root, extras, sha256 of pyproject.toml
  want=$(printf '%s\n%s\n%s' "$root" "$extras" "$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)")
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] ||
    ! "$venv/bin/python" - "$root" <<'PY' 2>/dev/null
import pathlib, sys
import sapwood.platform as p
here = pathlib.Path(p.__file__).resolve()
sys.exit(0 if here.is_relative_to(pathlib.Path(sys.argv[1]).resolve()) else 1)
PY
  then
    echo "[venv] pip install -e '.[$extras]' into $venv" >&2
    (cd "$root" && "$venv/bin/python" -m pip install -q -e ".[$extras]") || return 1
    echo "$want" >"$stamp"
  fi

  export VIRTUAL_ENV=$venv
  export PATH="$venv/bin:$PATH"
}
