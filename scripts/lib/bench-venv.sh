# shellcheck shell=bash
# A benchmark peer's Python packages in a venv of its own under $EBBFLOW_CACHE, created once and
# cached by its requirements list (a stamp file holds the list it was built from).
#
#   cached_venv NAME "pkg==1.0 other==2.0" WHO
#
# prints the venv's python on stdout when it holds exactly those requirements; otherwise says on
# stderr that WHO's peers cannot run (their rows in the table will say so) and prints nothing.
cached_venv() {
  local name="$1" requirements="$2" who="$3"
  local venv="$EBBFLOW_CACHE/$name" stamp="$EBBFLOW_CACHE/$name/.requirements"
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$requirements" ]]; then
    echo "==> installing $requirements into $venv (once)" >&2
    # shellcheck disable=SC2086
    if python3 -m venv "$venv" >&2 &&
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $requirements >&2; then
      echo "$requirements" >"$stamp"
    else
      echo "$who: $requirements could not be installed; the peers' rows will say so" >&2
    fi
  fi
  if [[ -f "$stamp" ]]; then
    echo "$venv/bin/python"
  fi
}
