#!/usr/bin/env bash
# Create benchmarks/.env: shardio (editable) next to the peers it is measured against.
#
# Usage: bash benchmarks/setup_env.sh   (from anywhere; re-running it rebuilds the venv)
#
# torch==2.13.0 (CPU) is pinned by constraints.txt on every pip call, so no peer can pull
# another torch. mosaicml-streaming and litdata declare torchvision as a dependency, which
# does not import beside this torch; they are installed with --no-deps and their real
# runtime dependencies come from requirements-peers.txt. webdataset's own dependencies
# (braceexpand, numpy, pyyaml) are small and installed normally.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
env="$here/.env"
python="${PYTHON:-python3}"

rm -rf "$env"
"$python" -m venv "$env"
pip=("$env/bin/python" -m pip install -q -c "$here/constraints.txt")
"${pip[@]}" --upgrade pip
"${pip[@]}" torch==2.13.0
"${pip[@]}" -e "$repo" psutil lmdb webdataset
# shardio[remote] (fsspec, s3fs) resolved together with boto3, so botocore suits both
"${pip[@]}" -r "$here/requirements-peers.txt" -e "$repo[remote]"
"${pip[@]}" --no-deps mosaicml-streaming litdata

"$env/bin/python" - <<'PY'
import importlib.metadata as md
import sys

sys.path.insert(0, "benchmarks")
for name in ("torch", "shardio", "webdataset", "mosaicml-streaming", "litdata", "lmdb", "psutil"):
    print(f"{name:20s} {md.version(name)}")
assert md.version("torch").startswith("2.13.0"), "torch was replaced; check constraints.txt"
try:
    md.version("torchvision")
except md.PackageNotFoundError:
    pass
else:
    raise SystemExit("torchvision got installed; it does not import beside torch 2.13.0 CPU")
PY
(cd "$repo" && "$env/bin/python" -m benchmarks.adapters)
echo "benchmarks/.env ready: $env/bin/python -m benchmarks.run --help"
