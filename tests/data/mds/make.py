"""Write the MDS fixtures of ``tests/packing/test_import_mds.py`` with MosaicML Streaming's writer.

mosaicml-streaming imports torchvision at package import, which does not import beside the
project's torch, so this runs in a venv of its own (from the repository root):

    python3 -m venv /tmp/mdsenv
    /tmp/mdsenv/bin/pip install torch==2.14.1 torchvision==0.29.1 mosaicml-streaming
    /tmp/mdsenv/bin/python tests/data/mds/make.py

It writes ``plain/`` (no compression) and ``zstd/`` (``compression="zstd"``), the same 12
samples in shards of about 2 KB (columns ``image``: jpeg, ``blob``: bytes, ``caption``:
str, ``label``: int), and ``expected.json``: each sample in order, as MDS reads it back
(the JPEG by sha256), so that the tests need neither streaming nor torchvision.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

from PIL import Image
from streaming import MDSWriter, StreamingDataset

HERE = Path(__file__).resolve().parent
COLUMNS = {"image": "jpeg", "blob": "bytes", "caption": "str", "label": "int"}


def samples() -> list[dict[str, object]]:
    out = []
    for i in range(12):
        encoded = io.BytesIO()
        Image.new("RGB", (8, 8), (20 * i, 255 - 20 * i, 7)).save(encoded, format="JPEG",
                                                                  quality=60)
        image = Image.open(io.BytesIO(encoded.getvalue()))  # MDS keeps a JPEG's bytes as read
        out.append({"image": image, "blob": bytes(range(i, i + 3 * i)),
                    "caption": f"sample {i} é", "label": (i * 7) % 5 - 1})
    return out


def main() -> None:
    for name, compression in (("plain", None), ("zstd", "zstd")):
        folder = HERE / name
        shutil.rmtree(folder, ignore_errors=True)
        with MDSWriter(out=str(folder), columns=COLUMNS, compression=compression,
                       size_limit=2048) as writer:
            for sample in samples():
                writer.write(sample)
    expected = []
    for name in ("plain", "zstd"):  # MosaicML's reader reads both the same
        read = StreamingDataset(local=str(HERE / name), shuffle=False, batch_size=1)
        got = [{"image_sha256": hashlib.sha256(s["image"].fp.getvalue()).hexdigest(),
                "blob": s["blob"].hex(), "caption": s["caption"], "label": int(s["label"])}
               for s in (read[i] for i in range(len(read)))]
        assert not expected or got == expected, name
        expected = got
    for raw in (HERE / "zstd").glob("*.mds"):  # the reader's decompressed copies: not written
        raw.unlink()
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
