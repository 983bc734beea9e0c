"""Make the small slice of the real GraphChallenge data that the tests ship with.

Run from the repository root: ``python tests/data/make_slice.py ../shared/data/graphchallenge``. It takes the
first 12 layers of the real 1024-neuron network and the first 1,000 of the 60,000 images, and computes the
slice's truth with the float64 reference (the published truth is for all 120 layers).
"""

import io as _io
import sys
import tarfile
from pathlib import Path

import numpy as np

from dasknn import io, reference

LAYERS, IMAGES = 12, 1000

src = Path(sys.argv[1])
out = Path(__file__).parent
with tarfile.open(src / "neuron1024.tar.gz") as tar, tarfile.open(out / f"neuron1024-l{LAYERS}.tar.gz", "w:gz") as dst:
    for k in range(1, LAYERS + 1):
        m = tar.getmember(f"neuron1024/n1024-l{k}.tsv")
        data = tar.extractfile(m).read()
        info = tarfile.TarInfo(m.name)
        info.size = len(data)
        dst.addfile(info, _io.BytesIO(data))
images = io.read_images(src / "sparse-images-1024.tsv.gz")[:IMAGES]
io.write_images(out / "sparse-images-1024.tsv.gz", images)
net = io.read_network(out / f"neuron1024-l{LAYERS}.tar.gz")
cats = reference.infer_categories(net.layers, images, net.bias, net.ymax, np.float64)
io.write_categories(out / f"neuron1024-l{LAYERS}-categories.tsv", cats)
print(f"{LAYERS} layers, {IMAGES} images, {cats.size} categories")
