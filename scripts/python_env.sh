# Sourced by test.sh and demo.sh: sets $python, the interpreter to install into and run with. An active virtual
# environment (python3 on PATH is one) is used as it is; otherwise .venv in this checkout is made once and used, so
# nothing is ever installed into a system Python.
if python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    python=python3
else
    if [ ! -x .venv/bin/python ]; then
        echo "no virtual environment is active: making .venv here (later: . .venv/bin/activate)" >&2
        python3 -m venv .venv
    fi
    python=.venv/bin/python
fi
