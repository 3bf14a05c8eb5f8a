# Sourced first by the device scripts (scripts/campaign/gpu_window.sh, gpu_campaign.sh, gpu_tables.sh,
# scripts/packed/gpu_packed_slot.sh): OUT (required: the folder that comes back), PY (python3), ROOT
# (the checkout, on PYTHONPATH: the tools run as `python -m scripts.<folder>.<tool>` from any
# working directory), unbuffered output,
# no wandb; on a lent GPU machine without hydra-core / omegaconf, installs the wheels carried in
# .whl/ into a temporary folder on PYTHONPATH. Build them here once with
#   .venv/bin/pip wheel --no-deps -w .whl hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3
# and name .whl in the device call's carry. `machine_txt FILE` records the machine and the code
# version (provenance.py: git, or the stamp `python -m lpmetrics.run.provenance stamp` wrote before the call --
# the device gets the tree without .git, so carry .code_version.json too).
OUT=${OUT:?set OUT}; PY=${PY:-python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
if ! $PY -c "import hydra, omegaconf" 2>/dev/null; then
  _site=$(mktemp -d)
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$_site" "$ROOT"/.whl/*.whl \
    || { echo "no hydra here and no wheels in .whl/ (see scripts/campaign/device_env.sh)"; exit 3; }
  export PYTHONPATH="$_site${PYTHONPATH:+:$PYTHONPATH}"
fi
machine_txt() {
  { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
      || echo "no nvidia-smi"
    (cd "$ROOT" && $PY -c "import json, hydra, torch; from lpmetrics.run import provenance; \
print('hydra', hydra.__version__, json.dumps(provenance.record('cuda' if torch.cuda.is_available() else 'cpu')))"); \
    # why a record says dirty: what git sees there (no .git: the stamp's fingerprint decided)
    if [ -e "$ROOT/.git" ]; then echo "git status there:"; git -C "$ROOT" status --porcelain 2>&1 | head -n 20; \
    else echo "no .git there"; fi
  } > "$1" 2>&1
}
