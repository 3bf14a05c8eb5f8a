# Sourced by the device scripts (scripts/gpu_tables.sh, scripts/gpu_packed_slot.sh): on a lent GPU
# machine without hydra-core / omegaconf, install the wheels carried in .whl/ into a temporary
# folder and put it on PYTHONPATH. Build them here once with
#   .venv/bin/pip wheel --no-deps -w .whl hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3
# and name .whl in the device call's carry. Expects ROOT (the checkout) and PY (python3).
if ! $PY -c "import hydra, omegaconf" 2>/dev/null; then
  _site=$(mktemp -d)
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$_site" "$ROOT"/.whl/*.whl \
    || { echo "no hydra here and no wheels in .whl/ (see scripts/device_env.sh)"; exit 3; }
  export PYTHONPATH="$_site${PYTHONPATH:+:$PYTHONPATH}"
fi
