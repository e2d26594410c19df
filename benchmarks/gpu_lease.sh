#!/usr/bin/env bash
# The GPU checks of the fast engine for one 15-minute device lease, in one command.
#
# Before the lease, on the machine with the checkout (fills .whl/, about 6 MB; in a git
# worktree, where .git is a file, the kit's .git/info/exclude step fails: .whl/ is in
# .gitignore already, so create .whl/ and run its pip download lines, or run it from a
# plain clone):
#     ../shared/device-kit/fetch-wheels.sh engine
# Then the device call, from the project's root, carrying .whl (timeout about 420 s):
#     bash benchmarks/gpu_lease.sh
# It installs the wheels into /tmp/site (--no-deps: the machine keeps its own torch,
# say so next to any figure), writes into $OUT (else ./gpu_lease_out):
#   environment.txt  nvidia-smi, torch, CUDA, cuDNN, the GPU's compute capability
#   switches.txt     precision's switches on this torch (fp32_precision on >= 2.9)
#   engine_speed.txt benchmarks/engine_speed.py on the GPU: upstream and fast at IEEE
#                    fp32, TF32 and bf16, emulated TF32, the eigen-step's routes (the
#                    paper-size UNet, random weights, the paper's settings: about 3
#                    minutes on an H200; cut at 330 s, the lines printed so far kept)
# and prints them. Figures go into docs/gpus.md with the date and the GPU.
#
# Rehearsed on the CPU (2026-12-01, a 2-core x86_64 VM shared with other work, torch
# 2.8, no wheels: the venv's packages): REHEARSE=1 bash benchmarks/gpu_lease.sh, which
# runs the same steps with the tests' tiny UNet (1.5M parameters) and 2 timesteps x 8
# samples on the CPU (TF32 emulated there): about 2 to 4 minutes on that machine.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_lease_out}
mkdir -p "$out"
py=${PYTHON:-python3}

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
elif [ -z "${REHEARSE:-}" ]; then
  echo "no wheels in .whl/: run ../shared/device-kit/fetch-wheels.sh engine first" >&2
  exit 2
fi

{
  date -u '+%Y-%m-%d %H:%M UTC'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  "$py" - <<'EOF'
import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN",
      torch.backends.cudnn.version())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(p.name, f"capability {p.major}.{p.minor}", f"{p.total_memory / 2**30:.1f} GiB")
EOF
} 2>&1 | tee "$out/environment.txt"

"$py" - <<'EOF' 2>&1 | tee "$out/switches.txt"
import sys, warnings
sys.path.insert(0, "src")
import torch
from multigeom_workflow.compute.arithmetic import arithmetic_flags, precision_context
device = "cuda" if torch.cuda.is_available() else "cpu"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print("before:", arithmetic_flags())
    for precision in ("fp32", "tf32") if device == "cuda" else ("fp32",):
        with precision_context(precision, device):
            print(f"{precision}:", arithmetic_flags())
    print("after: ", arithmetic_flags())
print("warnings:", [str(w.message)[:120] for w in caught] or "none")
EOF

if [ -n "${REHEARSE:-}" ]; then
  args=(--device cpu --side-by-side --diffusion tests/data/diffusion_tiny.yaml
        --estimator tests/data/estimator_tiny.yaml --samples 8 --batch 4)
else
  args=(--device cuda)
fi
timeout 330 "$py" benchmarks/engine_speed.py "${args[@]}" 2>&1 | tee "$out/engine_speed.txt"
echo "written: $out/environment.txt $out/switches.txt $out/engine_speed.txt"
