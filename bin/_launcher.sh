# Shared by the launchers in bin/: run an MTGPU module from this checkout.
# The interpreter is $MTGPU_PYTHON, else the installed virtualenv's (it has the
# dependencies), else the system Python (enough for `mtgpu-setup install`).
MTGPU_SRC=$(cd "$(dirname "$0")/.." && pwd -P)
launch() {
    module=$1; shift
    py=${MTGPU_PYTHON:-}
    [ -n "$py" ] || { [ -x /opt/mtgpu/venv/bin/python ] && py=/opt/mtgpu/venv/bin/python; }
    [ -n "$py" ] || py=/usr/bin/python3
    # PYTHONSAFEPATH: `-m` must not import an mtgpu/ from the current directory instead
    # of this tree's (an unpacked bundle run from a checkout, say).
    PYTHONSAFEPATH=1 PYTHONPATH="$MTGPU_SRC${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m "$module" "$@"
}
