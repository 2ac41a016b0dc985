# Sourced by the scripts here: makes uv and nox available in .tools/ (nothing global is touched)
# and points uv at the local torch wheel that pip finds through PIP_FIND_LINKS.
if [ ! -x .tools/bin/nox ] || [ ! -x .tools/bin/uv ]; then
  python3 -m venv .tools
  .tools/bin/python -m pip install -q --disable-pip-version-check "uv==0.13.9" "nox==2026.10.20"
fi
export UV="$PWD/.tools/bin/uv"
export PATH="$PWD/.tools/bin:$PATH"
export UV_FIND_LINKS="${UV_FIND_LINKS:-${PIP_FIND_LINKS:-}}"
# Bytecode is cached lazily on first import (see noxfile.py) rather than compiled at install.
unset PYTHONDONTWRITEBYTECODE
