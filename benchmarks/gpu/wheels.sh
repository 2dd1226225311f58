#!/bin/bash
# The wheels device_check.sh installs on the GPU machine, whose image lacks them (or holds
# older ones): the versions installed here, built for its Python 3.12 on x86-64, into
# .whl/ at the repo's root, emptied first: two versions of one package stop the install
# there (ignored by git; the device tool carries it: carry [".whl"]).
# bitsandbytes keeps only its CPU library and the CUDA build the image's torch loads
# (CUDA=130, its torch.version.cuda without the dot): its wheel holds one per CUDA, ROCm
# and XPU version (41 MiB of the 64 a call carries; 4 MiB stripped).
#   bash benchmarks/gpu/wheels.sh    # then: run STEPS=mfu bash benchmarks/gpu/device_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl && mkdir -p .git/info .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
names="optuna optuna-dashboard bottle alembic mako colorlog sqlalchemy datasets dill"
names="$names multiprocess transformers peft trl bitsandbytes liger-kernel"
for name in $names; do
  # the version installed here, where it is (liger-kernel is not on a CPU host)
  version=$(python3 -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' \
    "$name" 2>/dev/null) || version=""
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$name${version:+==$version}"
done
CUDA=${CUDA:-130} python3 - <<'EOF'
import os, pathlib, re, zipfile

for wheel in pathlib.Path(".whl").glob("bitsandbytes-*.whl"):
    kept = f"cpu|cuda{os.environ['CUDA']}"
    other_builds = re.compile(rf"libbitsandbytes_(?!(?:{kept})\.)")
    stripped = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(stripped, "w", zipfile.ZIP_DEFLATED) as out:
        for item in src.infolist():
            if not other_builds.search(item.filename):
                out.writestr(item, src.read(item))
    stripped.replace(wheel)
EOF
du -ch .whl/*.whl | tail -1
